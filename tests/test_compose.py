"""docker-compose.yml and the Dockerfile describe memmill's production shape. Docker is not
needed here: these tests load both files and hold them to the code (CLI subcommands and options,
Settings fields, the console script, the lock and the torch pin of ./dev). Every helper is also
tried against a deliberately wrong value, so that each check is known to be able to fail."""

from __future__ import annotations

import copy
import http.server
import re
import shlex
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from importlib import import_module
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import pytest
import typer.main
import yaml

from memmill.cli import app
from pipeline.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PYPROJECT = ROOT / "pyproject.toml"
DEV_SCRIPT = ROOT / "dev"
LOCK = ROOT / "requirements.lock"

MEMMILL_SERVICES = ("migrate", "api", "worker")
LONG_RUNNING = ("api", "worker")
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
ENV_PREFIX = "MEMMILL_"
REDIS_PASSWORD_VAR = "MEMMILL_REDIS_PASSWORD"
# What the operator sets on the host before `docker compose up` (the compose file requires it).
HOST_ENV = {REDIS_PASSWORD_VAR: "9f" * 32}


# --- helpers -----------------------------------------------------------------------------------


def argv(command: str | list[str] | None) -> list[str]:
    """A compose `command` (string or list) as the argv the container runs."""
    if command is None:
        return []
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


# Typer >= 0.25 vendors click (typer._click), whose errors subclass TyperException; older Typer
# uses click itself.
CLI_ERRORS = (typer.TyperException, click.ClickException)


def cli_group() -> Any:
    """The click group behind the Typer app (`.commands[name].params[i].opts`)."""
    group = typer.main.get_command(app)
    assert isinstance(getattr(group, "commands", None), dict), "memmill.cli.app is not a group"
    return group


def cli_problems(args: list[str], script: str = "memmill") -> list[str]:
    """What is wrong with running `args` against the memmill CLI; [] when it would parse."""
    if not args or args[0] != script:
        return [f"{args!r} does not run the {script} console script"]
    if len(args) < 2:
        return [f"{args!r} names no subcommand"]
    group = cli_group()
    name, rest = args[1], args[2:]
    command = group.commands.get(name)
    if command is None:
        return [f"{name!r} is not a subcommand of {script} (have {sorted(group.commands)})"]
    known = {opt for p in command.params for opt in [*p.opts, *p.secondary_opts]} | {"--help"}
    problems = [
        f"{script} {name} has no option {token.split('=', 1)[0]}"
        for token in rest
        if token.startswith("--") and token.split("=", 1)[0] not in known
    ]
    if not problems:
        try:  # full parse (types, ranges, stray arguments); make_context does not invoke
            command.make_context(f"{script} {name}", list(rest))
        except CLI_ERRORS as exc:
            problems.append(f"{script} {name}: {exc.format_message()}")
    return problems


def cli_params(args: list[str]) -> dict[str, Any]:
    command = cli_group().commands[args[1]]
    return command.make_context(f"memmill {args[1]}", list(args[2:])).params


def env_of(block: dict[str, Any] | list[str] | None) -> dict[str, str]:
    """A compose `environment` (mapping or list of K=V) as a dict."""
    if block is None:
        return {}
    if isinstance(block, dict):
        return {str(k): "" if v is None else str(v) for k, v in block.items()}
    return dict(item.split("=", 1) if "=" in item else (item, "") for item in block)


_INTERPOLATION = re.compile(r"\$\$|\$\{(\w+)(?:(:?[-?])([^}]*))?\}|\$(\w+)")


class MissingVariable(ValueError):
    """A ${VAR:?message} (or ${VAR?message}) whose variable the host does not set: compose
    refuses to start."""


def interpolate(value: str, host_env: dict[str, str] | None = None) -> str:
    """Compose's variable substitution ($$, ${VAR}, ${VAR-default}, ${VAR:-default},
    ${VAR:?error}, ${VAR?error}, $VAR)."""
    host_env = host_env or {}

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        if m.group(2) in (":?", "?"):
            if (host_env.get(name) if m.group(2) == ":?" else name in host_env):
                return host_env[name]
            raise MissingVariable(f"{name}: {m.group(3)}")
        if m.group(2) == ":-":
            return host_env.get(name) or m.group(3)
        if m.group(2) == "-":
            return host_env.get(name, m.group(3))
        return host_env.get(name, "")

    return _INTERPOLATION.sub(sub, value)


def unknown_settings(names: list[str] | set[str]) -> list[str]:
    """MEMMILL_ variables that no Settings field reads (the prefix is case-insensitive)."""
    return sorted(
        n
        for n in names
        if n.upper().startswith(ENV_PREFIX)
        and n[len(ENV_PREFIX) :].lower() not in Settings.model_fields
    )


def memmill_vars(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.upper().startswith(ENV_PREFIX)}


def redis_auth_problems(compose: dict[str, Any]) -> list[str]:
    """What would let a client into the compose Redis without the password, or keep memmill
    out: no --requirepass, a password with a default or written in the file (everyone who
    reads it knows it), a healthcheck that cannot authenticate, a MEMMILL_REDIS_URL (in any
    service or x- block) without that password."""
    services = compose.get("services") or {}
    redis = services.get("redis") or {}
    required = f"${{{REDIS_PASSWORD_VAR}:?"
    args = argv(redis.get("command"))
    problems = []
    if "--requirepass" not in args[:-1]:
        problems.append("redis-server runs without --requirepass")
    elif not args[args.index("--requirepass") + 1].startswith(required):
        problems.append(f"--requirepass is not {required}...}} (set on the host, no default)")
    if not env_of(redis.get("environment")).get("REDISCLI_AUTH", "").startswith(required):
        problems.append("redis-cli in the healthcheck has no REDISCLI_AUTH")
    blocks = {name: env_of(service.get("environment")) for name, service in services.items()}
    blocks |= {key: env_of(value) for key, value in compose.items()
               if key.startswith("x-") and isinstance(value, dict)}
    urls = {name: env["MEMMILL_REDIS_URL"] for name, env in blocks.items()
            if "MEMMILL_REDIS_URL" in env}
    if not urls:
        problems.append("no MEMMILL_REDIS_URL anywhere")
    for name, url in urls.items():
        password = urlsplit(interpolate(url, HOST_ENV)).password
        if required not in url or password != HOST_ENV[REDIS_PASSWORD_VAR]:
            problems.append(f"{name}: MEMMILL_REDIS_URL does not carry {REDIS_PASSWORD_VAR}")
    return problems


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)")
_UNIT_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """A compose duration ("30s", "1m30s", "500ms") in seconds; anything else raises."""
    if not isinstance(text, str) or not re.fullmatch(f"(?:{_DURATION_PART.pattern})+", text):
        raise ValueError(f"not a compose duration: {text!r}")
    return sum(float(n) * _UNIT_S[u] for n, u in _DURATION_PART.findall(text))


def published_ports(service: dict[str, Any]) -> list[tuple[int | None, int]]:
    """(host port, container port) for each entry of `ports`, short or long syntax."""
    out: list[tuple[int | None, int]] = []
    for entry in service.get("ports") or []:
        if isinstance(entry, dict):
            published = entry.get("published")
            out.append((int(published) if published else None, int(entry["target"])))
            continue
        parts = str(entry).split("/", 1)[0].split(":")
        target = int(parts[-1])
        published = int(parts[-2]) if len(parts) >= 2 and parts[-2] else None
        out.append((published, target))
    return out


def healthcheck_argv(service: dict[str, Any]) -> list[str]:
    test = (service.get("healthcheck") or {}).get("test")
    if not test or test == ["NONE"]:
        return []
    if isinstance(test, str):
        return shlex.split(test)
    if test[0] == "CMD":
        return [str(a) for a in test[1:]]
    if test[0] == "CMD-SHELL":
        return shlex.split(" ".join(test[1:]))
    return [str(a) for a in test]


def dependency_conditions(service: dict[str, Any]) -> dict[str, str]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def named_volume_mounts(service: dict[str, Any]) -> dict[str, str]:
    """{container path: volume name} for the named volumes a service mounts."""
    mounts: dict[str, str] = {}
    for entry in service.get("volumes") or []:
        if isinstance(entry, dict):
            if entry.get("type", "volume") == "volume" and entry.get("source"):
                mounts[entry["target"]] = entry["source"]
            continue
        source, _, rest = str(entry).partition(":")
        if rest and not source.startswith(("/", ".", "~", "$")):
            mounts[rest.split(":", 1)[0]] = source
    return mounts


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            keyword, _, args = full.partition(" ")
            out.append((keyword.upper(), args.strip()))
    return out


def dockerfile_env(instructions: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, args in instructions:
        if keyword != "ENV":
            continue
        tokens = shlex.split(args)
        if tokens and "=" not in tokens[0]:  # legacy `ENV NAME value`
            env[tokens[0]] = " ".join(tokens[1:])
        else:
            env.update(t.split("=", 1) for t in tokens)
    return env


def pip_installs(instructions: list[tuple[str, str]]) -> list[tuple[int, str]]:
    """(instruction index, RUN arguments) of every RUN that runs pip install."""
    return [
        (i, args)
        for i, (keyword, args) in enumerate(instructions)
        if keyword == "RUN" and re.search(r"\bpip\s+install\b", args)
    ]


def install_order_problems(text: str) -> list[str]:
    """The image installs exactly the lock: one `pip install --require-hashes -r
    requirements.lock` with the CPU index (the lock's torch is the CPU build), before the
    repository is copied and before any other pip install; then the project alone (`--no-deps
    -e .`), so nothing is resolved in the image."""
    instructions = dockerfile_instructions(text)
    installs = pip_installs(instructions)
    locked = [i for i, args in installs if re.search(rf"-r\s+{LOCK.name}(\s|$)", args)]
    if not locked:
        return [f"no RUN pip install -r {LOCK.name}"]
    first = locked[0]
    problems = []
    args = instructions[first][1]
    if "--require-hashes" not in args:
        problems.append(f"{LOCK.name} is installed without --require-hashes")
    if f"--extra-index-url {TORCH_CPU_INDEX}" not in args:
        problems.append(f"{LOCK.name} is installed without the CPU index {TORCH_CPU_INDEX}")
    if any(i < first for i, _ in installs):
        problems.append(f"a pip install runs before {LOCK.name}")
    lock_copies = [i for i, (k, a) in enumerate(instructions) if k == "COPY" and LOCK.name in a]
    if not lock_copies or lock_copies[0] > first:
        problems.append(f"{LOCK.name} is not copied before it is installed")
    editable = [i for i, a in installs if re.search(r"pip\s+install\s+(.*\s)?-e\s+\.", a)]
    if not editable:
        problems.append("the project is not installed with `pip install -e .`")
    elif editable[0] < first:
        problems.append(f"`pip install -e .` runs before {LOCK.name}")
    elif "--no-deps" not in instructions[editable[0]][1]:
        problems.append("`pip install -e .` resolves dependencies (add --no-deps)")
    copies = [
        i
        for i, (k, args) in enumerate(instructions)
        if k == "COPY" and [a for a in args.split() if not a.startswith("--")][:1] == ["."]
    ]
    if not copies:
        problems.append("the repository is never copied (COPY . ...)")
    elif copies[0] < first:
        problems.append(f"the repository is copied before {LOCK.name} is installed")
    return problems


def exec_form(args: str) -> list[str]:
    """A CMD/ENTRYPOINT argument as argv (JSON exec form, or shell form)."""
    args = args.strip()
    return yaml.safe_load(args) if args.startswith("[") else shlex.split(args)


def dev_torch_pin() -> str:
    match = re.search(r"torch==[\w.+]+", DEV_SCRIPT.read_text())
    assert match, "./dev no longer pins torch"
    return match.group(0)


def locked_version(name: str) -> str:
    match = re.search(rf"^{re.escape(name)}==(\S+)", LOCK.read_text(), re.MULTILINE)
    assert match, f"{name} is not in {LOCK.name}"
    return match.group(1)


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict) and isinstance(data.get("services"), dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


@pytest.fixture(scope="module")
def instructions() -> list[tuple[str, str]]:
    return dockerfile_instructions(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def console_script() -> str:
    scripts = tomllib.loads(PYPROJECT.read_text())["project"]["scripts"]
    assert "memmill" in scripts, "pyproject.toml declares no `memmill` console script"
    return "memmill"


# --- the helpers can fail ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["memmill", "serve"],  # no such subcommand
        ["memmill", "api", "--bind", "0.0.0.0"],  # no such option
        ["memmill", "worker", "--port", "8700"],  # an option of another subcommand
        ["memmill", "api", "--port", "http"],  # not an int
        ["memmill", "up", "--workers", "0"],  # out of range
        ["memmill", "migrate", "now"],  # stray argument
        ["memmill"],
        ["uvicorn", "api.main:app"],  # not the console script
    ],
)
def test_cli_problems_catches_a_wrong_command(args: list[str]) -> None:
    assert cli_problems(args)


def test_cli_problems_accepts_a_right_command() -> None:
    assert cli_problems(["memmill", "api", "--host", "0.0.0.0", "--port=8700"]) == []
    assert cli_params(["memmill", "api", "--port", "9000"])["port"] == 9000


def test_unknown_settings_catches_names_that_settings_ignores() -> None:
    names = [
        "MEMMILL_DATABASE_URL",
        "memmill_api_port",
        "MEMMILL_NOT_A_SETTING",
        "MEMMILL_LOG_LEVEL",
        "MEMMILL_DATABASE",
    ]
    assert unknown_settings(names) == ["MEMMILL_DATABASE", "MEMMILL_NOT_A_SETTING"]


def test_interpolate() -> None:
    assert interpolate("${K:-}") == ""
    assert interpolate("a${K:?say K}b", {"K": "s"}) == "asb"
    assert interpolate("${K?say K}", {"K": ""}) == ""
    for host in ({}, {"K": ""}):
        with pytest.raises(MissingVariable, match="say K"):
            interpolate("${K:?say K}", host)
    with pytest.raises(MissingVariable):
        interpolate("${K?say K}")
    assert interpolate("${K:-}", {"K": "secret"}) == "secret"
    assert interpolate("${K-x}", {"K": ""}) == ""
    assert interpolate("${K:-x}", {"K": ""}) == "x"
    assert interpolate("a$$b$K", {"K": "1"}) == "a$b1"


def test_redis_auth_problems_catches_an_open_redis(compose: dict[str, Any]) -> None:
    assert redis_auth_problems(compose) == []
    wrong: list[dict[str, Any]] = []
    for change in (
        lambda c: c["services"]["redis"].update(command="redis-server --appendonly yes"),
        lambda c: c["services"]["redis"].update(
            command="redis-server --requirepass ${MEMMILL_REDIS_PASSWORD:-memmill}"),
        lambda c: c["services"]["redis"].update(command="redis-server --requirepass memmill"),
        lambda c: c["services"]["redis"].pop("environment"),
        lambda c: c["x-memmill-env"].update(MEMMILL_REDIS_URL="redis://redis:6379/0"),
        lambda c: c["services"]["worker"].update(
            environment={"MEMMILL_REDIS_URL": "redis://:memmill@redis:6379/0"}),
    ):
        changed = copy.deepcopy(compose)
        change(changed)
        wrong.append(changed)
    for changed in wrong:
        assert redis_auth_problems(changed), changed["services"]["redis"]


def test_parse_duration() -> None:
    assert parse_duration("30s") == 30
    assert parse_duration("1m30s") == 90
    assert parse_duration("500ms") == 0.5
    for wrong in ("30", "thirty seconds", "30 s", 30):
        with pytest.raises(ValueError):
            parse_duration(wrong)  # type: ignore[arg-type]


def test_ports_healthchecks_dependencies_and_volumes_helpers() -> None:
    assert published_ports({"ports": ["127.0.0.1:8080:8700/tcp", "9000", 7000]}) == [
        (8080, 8700),
        (None, 9000),
        (None, 7000),
    ]
    assert published_ports({"ports": [{"target": 8700, "published": "80"}]}) == [(80, 8700)]
    assert healthcheck_argv({"healthcheck": {"test": ["CMD-SHELL", "redis-cli ping"]}}) == [
        "redis-cli",
        "ping",
    ]
    assert healthcheck_argv({"healthcheck": {"test": ["NONE"]}}) == []
    assert dependency_conditions({"depends_on": ["postgres"]}) == {"postgres": "service_started"}
    assert named_volume_mounts({"volumes": ["./data:/data", "pg:/var/lib/pg:ro"]}) == {
        "/var/lib/pg": "pg"
    }


LOCKED = """\
FROM python:3.11-slim
COPY requirements.lock ./
RUN pip install --require-hashes --no-deps --extra-index-url INDEX -r requirements.lock
COPY . .
RUN pip install --no-deps -e .
""".replace("INDEX", TORCH_CPU_INDEX)


def test_install_order_problems_catches_wrong_dockerfiles() -> None:
    assert install_order_problems(LOCKED) == []
    unlocked = LOCKED.replace("-r requirements.lock", "-r requirements.txt")
    assert install_order_problems(unlocked) == ["no RUN pip install -r requirements.lock"]
    assert any("--require-hashes" in p
               for p in install_order_problems(LOCKED.replace("--require-hashes ", "")))
    assert any("CPU index" in p
               for p in install_order_problems(LOCKED.replace(TORCH_CPU_INDEX, "x")))
    early = LOCKED.replace("COPY requirements.lock ./\n",
                           "RUN pip install torch\nCOPY requirements.lock ./\n")
    assert any("runs before" in p for p in install_order_problems(early))
    copied_first = LOCKED.replace("COPY requirements.lock ./\n", "COPY . .\n")
    assert any("copied before" in p for p in install_order_problems(copied_first))
    resolving = LOCKED.replace("pip install --no-deps -e .", "pip install -e .")
    assert any("--no-deps" in p for p in install_order_problems(resolving))


def test_dockerfile_parsing() -> None:
    text = '# c\nENV A=1 \\\n    # inside\n    B=two\nENV C 3 4\nCMD ["x", "y"]\n'
    parsed = dockerfile_instructions(text)
    assert [k for k, _ in parsed] == ["ENV", "ENV", "CMD"]
    assert dockerfile_env(parsed) == {"A": "1", "B": "two", "C": "3 4"}
    assert exec_form(parsed[2][1]) == ["x", "y"]


# --- docker-compose.yml ------------------------------------------------------------------------


def test_memmill_services_run_real_cli_commands(
    services: dict[str, dict[str, Any]], console_script: str
) -> None:
    for name in MEMMILL_SERVICES:
        assert name in services, f"no {name} service"
        assert argv(services[name].get("command"))[:1] == [console_script], name
        assert argv(services[name]["command"])[1] == name, f"{name} should run `memmill {name}`"
    for name, service in services.items():
        args = argv(service.get("command"))
        if args[:1] == [console_script]:
            assert cli_problems(args, console_script) == [], name


def test_memmill_services_are_built_from_the_dockerfile(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in MEMMILL_SERVICES:
        build = services[name].get("build")
        assert build is not None, f"{name} is not built from the Dockerfile"
        if isinstance(build, str):
            build = {"context": build}
        dockerfile = ROOT / build.get("context", ".") / build.get("dockerfile", "Dockerfile")
        assert dockerfile.resolve() == DOCKERFILE.resolve(), name


def test_memmill_environment_variables_are_settings_fields(
    compose: dict[str, Any],
    services: dict[str, dict[str, Any]],
    instructions: list[tuple[str, str]],
) -> None:
    seen: dict[str, str] = {}
    for name, service in services.items():
        seen |= memmill_vars(env_of(service.get("environment")))
        assert not service.get("env_file"), f"{name}: env_file hides variables from this test"
    for key, value in compose.items():
        if key.startswith("x-") and isinstance(value, dict):
            seen |= memmill_vars(env_of(value))
    seen |= memmill_vars(dockerfile_env(instructions))
    assert {
        "MEMMILL_DATABASE_URL",
        "MEMMILL_REDIS_URL",
        "MEMMILL_DATA_DIR",
        "MEMMILL_BOOTSTRAP_API_KEY",
    } <= set(seen)
    assert unknown_settings(set(seen)) == []
    # ...and their values are valid for those fields, as compose would pass them.
    for name in MEMMILL_SERVICES:
        env = memmill_vars(env_of(services[name].get("environment")))
        values = {k[len(ENV_PREFIX) :].lower(): interpolate(v, HOST_ENV) for k, v in env.items()}
        Settings(**values)


def test_memmill_environment_points_at_the_compose_services(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    assert "x-memmill-env" in compose, "the shared x-memmill-env block is gone"
    pg_env = env_of(services["postgres"].get("environment"))
    for name in MEMMILL_SERVICES:
        env = env_of(services[name].get("environment"))
        db = urlsplit(env["MEMMILL_DATABASE_URL"])
        assert db.scheme in ("postgresql", "postgres"), name
        assert (db.hostname, db.port or 5432) == ("postgres", 5432), name
        assert (db.username, db.password, db.path.lstrip("/")) == (
            pg_env["POSTGRES_USER"],
            pg_env["POSTGRES_PASSWORD"],
            pg_env["POSTGRES_DB"],
        ), name
        redis = urlsplit(interpolate(env["MEMMILL_REDIS_URL"], HOST_ENV))
        assert (redis.scheme, redis.hostname, redis.port or 6379) == ("redis", "redis", 6379), name
        assert env["MEMMILL_BOOTSTRAP_API_KEY"] == "${MEMMILL_BOOTSTRAP_API_KEY:-}", name
        data_dir = env["MEMMILL_DATA_DIR"]
        assert data_dir in named_volume_mounts(services[name]), f"{name}: {data_dir} not a volume"


def test_postgres_is_pgvector_with_a_healthcheck(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    pg = services["postgres"]
    image, _, tag = pg["image"].partition(":")
    assert image == "pgvector/pgvector"
    assert re.fullmatch(r"(\d+\.\d+\.\d+-)?pg1[3-9]", tag), tag  # pgvector 0.8+ builds pg13+
    env = env_of(pg.get("environment"))
    assert env["POSTGRES_USER"] == env["POSTGRES_DB"] == env["POSTGRES_PASSWORD"] == "memmill"
    assert healthcheck_argv(pg) == [
        "pg_isready",
        "-U",
        env["POSTGRES_USER"],
        "-d",
        env["POSTGRES_DB"],
    ]
    # From Postgres 18 the official images keep PGDATA in a versioned folder under this one.
    volume = named_volume_mounts(pg).get("/var/lib/postgresql")
    assert volume and volume in (compose.get("volumes") or {})
    assert tag.endswith("pg18"), "the tests run Postgres 18; production should match"
    args = argv(pg.get("command"))
    assert args[:1] == ["postgres"], "the image's entrypoint runs the command as postgres"
    buffers = [a.split("=", 1)[1] for a in args[1:] if a.startswith("shared_buffers=")]
    assert buffers and parse_size_mb(buffers[0]) >= 512, "search wants its pages in buffers"


def parse_size_mb(value: str) -> float:
    """A Postgres memory setting ('1GB', '512MB') in MB."""
    number, unit = re.fullmatch(r"(\d+)\s*(kB|MB|GB)", value).groups()  # type: ignore[union-attr]
    return int(number) * {"kB": 1 / 1024, "MB": 1, "GB": 1024}[unit]


def test_redis_keeps_an_append_only_file(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    redis = services["redis"]
    assert redis["image"] == "redis:7-alpine"
    args = argv(redis.get("command"))
    assert args[:1] == ["redis-server"]
    assert "--appendonly" in args and args[args.index("--appendonly") + 1] == "yes"
    assert healthcheck_argv(redis) == ["redis-cli", "ping", "|", "grep", "-qx", "PONG"]
    volume = named_volume_mounts(redis).get("/data")
    assert volume and volume in (compose.get("volumes") or {})


def test_redis_and_postgres_refuse_clients_without_credentials(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    """Redis requires MEMMILL_REDIS_PASSWORD, which the host must set (compose refuses to start
    without it) and every MEMMILL_REDIS_URL carries; Postgres keeps the image's password
    authentication for every network client."""
    assert redis_auth_problems(compose) == []
    with pytest.raises(MissingVariable, match=REDIS_PASSWORD_VAR):
        interpolate(compose["x-memmill-env"]["MEMMILL_REDIS_URL"])
    pg_env = env_of(services["postgres"].get("environment"))
    assert pg_env.get("POSTGRES_HOST_AUTH_METHOD", "scram-sha-256") != "trust"
    assert pg_env["POSTGRES_PASSWORD"]
    assert not published_ports(services["redis"]) and not published_ports(services["postgres"])


def test_startup_order(services: dict[str, dict[str, Any]]) -> None:
    assert dependency_conditions(services["migrate"]) == {"postgres": "service_healthy"}
    for name in LONG_RUNNING:
        assert dependency_conditions(services[name]) == {
            "postgres": "service_healthy",
            "redis": "service_healthy",
            "migrate": "service_completed_successfully",
        }, name
    for name, service in services.items():
        for dep, condition in dependency_conditions(service).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            if condition == "service_healthy":
                assert healthcheck_argv(services[dep]), f"{dep} has no healthcheck for {name}"
    # Unquoted, YAML 1.1 reads `no` as False, which compose rejects.
    assert services["migrate"].get("restart") == "no"


def test_worker_can_scale(services: dict[str, dict[str, Any]]) -> None:
    worker = services["worker"]
    assert "container_name" not in worker
    assert not worker.get("ports")
    assert parse_duration(worker["stop_grace_period"]) >= 30


def test_api_port_matches_its_command_and_healthcheck(services: dict[str, dict[str, Any]]) -> None:
    api = services["api"]
    params = cli_params(argv(api["command"]))
    assert params["host"] == "0.0.0.0"
    assert published_ports(api) == [(params["port"], params["port"])]
    check = healthcheck_argv(api)
    assert check[:2] == ["python", "-c"], "the image has no curl: use python -c"
    urls = re.findall(r"https?://[^'\"\s]+", check[2])
    assert [urlsplit(u).port for u in urls] == [params["port"]]
    assert [urlsplit(u).path for u in urls] == ["/healthz"]
    compile(check[2], "<api healthcheck>", "exec")


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(self.server.status if self.path == "/healthz" else 404)  # type: ignore[attr-defined]
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[http.server.HTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    server.status = 200  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_api_healthcheck_fails_when_degraded(
    services: dict[str, dict[str, Any]], health_server: http.server.HTTPServer
) -> None:
    """The healthcheck's own code, pointed at a stand-in: exit 0 on 200, non-zero on 503."""
    code = healthcheck_argv(services["api"])[2]
    port = cli_params(argv(services["api"]["command"]))["port"]
    local = f"http://127.0.0.1:{health_server.server_address[1]}"
    code = code.replace(f"http://127.0.0.1:{port}", local)
    assert local in code
    results = {}
    for status in (200, 503):
        health_server.status = status  # type: ignore[attr-defined]
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30)
        results[status] = run.returncode
    assert results[200] == 0
    assert results[503] != 0


# --- Dockerfile --------------------------------------------------------------------------------


def test_dockerfile_base_and_offline_model(instructions: list[tuple[str, str]]) -> None:
    froms = [args for keyword, args in instructions if keyword == "FROM"]
    assert froms == ["python:3.11-slim"]
    requires = tomllib.loads(PYPROJECT.read_text())["project"]["requires-python"]
    assert requires == ">=3.11"
    assert dockerfile_env(instructions).get("HF_HUB_OFFLINE") == "1"


def test_dockerfile_installs_exactly_the_lock_with_the_cpu_torch_of_dev() -> None:
    assert install_order_problems(DOCKERFILE.read_text()) == []
    assert dev_torch_pin() == "torch==2.13.0+cpu"
    assert f"torch=={locked_version('torch')}" == dev_torch_pin()
    # The lock holds no CUDA library: the CPU build needs none.
    assert not re.search(r"^nvidia-", LOCK.read_text(), re.MULTILINE)


def test_dockerfile_cmd_runs_the_console_script(
    instructions: list[tuple[str, str]], console_script: str
) -> None:
    cmds = [args for keyword, args in instructions if keyword == "CMD"]
    assert cmds, "no CMD"
    assert not [k for k, _ in instructions if k == "ENTRYPOINT"]
    args = exec_form(cmds[-1])
    assert args == ["memmill", "api", "--host", "0.0.0.0"]
    assert cli_problems(args, console_script) == []
    target = tomllib.loads(PYPROJECT.read_text())["project"]["scripts"][console_script]
    module, _, func = target.partition(":")
    assert callable(getattr(import_module(module), func))


def test_dockerignore_keeps_the_host_environment_out() -> None:
    patterns = {line.strip().rstrip("/") for line in DOCKERIGNORE.read_text().splitlines()}
    for needed in (".venv", ".git", "__pycache__", ".pytest_cache", ".ruff_cache"):
        assert needed in patterns, needed
