"""Providers behind small protocols, chosen by settings and loaded lazily."""
