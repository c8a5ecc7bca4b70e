"""`memmill mcp`: memmill's MCP server over stdio, for Claude Desktop, an IDE or any MCP client
that starts its servers as commands.

It finds the API and its key as every client command does (`memmill.cli.resolve_target`):
`--url`/`--key`, then MEMMILL_URL/MEMMILL_API_KEY, then the `memmill up` of the data directory.
Standard output is the protocol's channel, so everything this command says goes to stderr.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Annotated

import typer

# The options of the top-level client commands: memmill/cli.py imports this module to register
# it, so this module cannot import them from there (memmill/memory_cli.py does the same).
UrlOpt = Annotated[
    str | None,
    typer.Option("--url", envvar="MEMMILL_URL", help="API URL (default: the local memmill)."),
]
KeyOpt = Annotated[
    str | None,
    typer.Option("--key", envvar="MEMMILL_API_KEY",
                 help="API key (default: the local instance's key)."),
]
DataDirOpt = Annotated[
    Path | None,
    typer.Option("--data-dir", envvar="MEMMILL_DATA_DIR",
                 help="Talk to the `memmill up` of this data directory (--url and --key win)."),
]


def mcp(
    url: UrlOpt = None, key: KeyOpt = None, data_dir: DataDirOpt = None,
    user: Annotated[str | None, typer.Option(
        "--user", help="The user_id of tool calls that name none.")] = None,
    agent: Annotated[str | None, typer.Option(
        "--agent", help="The agent_id of tool calls that name none.")] = None,
) -> None:
    """Serve memmill's MCP tools (remember, recall, get_context, forget, ingest, status) on
    stdin/stdout, calling the API with this key; `ingest` may read local files."""
    from memmill.cli import resolve_target
    from memmill.mcp_server import serve_stdio

    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    api_url, api_key = resolve_target(url, key, data_dir)
    asyncio.run(serve_stdio(api_url, api_key, user_id=user, agent_id=agent))
