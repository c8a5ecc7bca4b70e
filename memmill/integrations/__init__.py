"""memmill inside agent frameworks, each an optional extra that the core never imports:

- `memmill.integrations.langgraph.MemmillStore`, a LangGraph store (`memmill[langgraph]`);
- `memmill.integrations.langchain.MemmillRetriever`, a LangChain retriever
  (`memmill[langchain]`).

Importing one without its framework installed raises an ImportError that names the extra.
"""

from __future__ import annotations


def missing_extra(module: str, package: str, extra: str) -> ImportError:
    """The error for an integration whose framework is not installed: the framework's own
    ModuleNotFoundError names a package the caller may never have heard of."""
    return ImportError(f"{module} needs {package}, which is not installed: "
                       f"pip install 'memmill[{extra}]'")
