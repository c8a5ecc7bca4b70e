"""Memories from sessions: extractors propose, deciders choose what each proposal does."""
