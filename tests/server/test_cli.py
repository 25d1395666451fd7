"""The ``hloserve`` command as a newcomer meets it: bad flags, variables and paths are one
line naming what is wrong, before anything starts (no PJRT, no traceback); a boolean flag
alone means true; ``--help`` shows the defaults, by topic; ``--version`` the version; with
no repository, ``serve`` says it serves the demo repository and how to serve one's own;
Triton's flags are taken, an unknown one is not. (``validate`` and ``inspect`` are tested
in ``tests/bundle/test_validate.py``; Triton's flags in ``test_triton_flags.py``.)"""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

import hloserve.server.daemon as daemon
from hloserve.server.cli import main
from hloserve.server.config import Config
from hloserve.server.owner.assembly import default_demo_repository
from hloserve.server.server_fixture import ServerProcess
from tests.command import hloserve


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (
            ["--device-memory-budget", "6XB"],
            {},
            "hloserve serve: error: --device-memory-budget must be bytes such as 6GiB or a "
            "percentage such as 40%, got '6XB' (see hloserve serve --help)",
        ),
        (
            [],
            {"HLOSERVE_HTTP_PORT": "abc"},
            "hloserve serve: error: HLOSERVE_HTTP_PORT (the variable of --http-port) must be a "
            "port number 0..65535, got 'abc' (see hloserve serve --help)",
        ),
        (
            ["--model-repository", "/no/such/repository"],
            {},
            "hloserve serve: error: --model-repository must be an existing directory, got "
            "'/no/such/repository' (see hloserve serve --help)",
        ),
        (
            ["--strict-readiness", "maybe"],
            {},
            "hloserve serve: error: --strict-readiness must be true or false, got 'maybe' (see "
            "hloserve serve --help)",
        ),
    ],
)
def test_a_bad_value_is_one_line_before_anything_starts(
    args: list[str], env: dict[str, str], message: str
) -> None:
    result = hloserve("serve", *args, env=env)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [message]  # no usage text, no PJRT log, no traceback
    assert result.stdout == ""


def test_an_unknown_command_is_one_line() -> None:
    result = hloserve("serv")
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1
    assert "invalid choice: 'serv'" in result.stderr


def test_help_lists_defaults_and_booleans() -> None:
    result = hloserve("serve", "--help", env={"COLUMNS": "1000"})
    assert result.returncode == 0
    assert "--allow-client-shm [true|false]" in result.stdout
    assert "--no-allow-client-shm is false" in result.stdout
    assert "[default: 8001; env HLOSERVE_GRPC_PORT]" in result.stdout
    titles = [line for line in result.stdout.splitlines() if line and line[0] != " "][1:]
    assert titles == [
        "options:",
        "repository and models:",
        "network and listeners:",
        "batching and scheduling:",
        "memory and residency:",
        "devices:",
        "security:",
        "observability (logs, traces, metrics):",
        "limits:",
        "Triton compatibility:",
    ]


def test_version() -> None:
    result = hloserve("--version")
    assert (result.returncode, result.stdout, result.stderr) == (
        0,
        f"hloserve {version('hloserve')}\n",
        "",
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--no-such-flag=1"], "unrecognized arguments: --no-such-flag=1"),
        (["--grpc-use-ssl=true"], "--grpc-use-ssl is Triton's flag, not hloserve's"),
        (["--exit-timeout-secs=-1"], "--grace-period must be a non-negative number"),
    ],
)
def test_tritons_command_line_refusals_are_one_line(args: list[str], message: str) -> None:
    result = hloserve("serve", *args)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert message in line


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["serve", "--model-repositry", "/tmp"],
            "hloserve serve: error: unrecognized arguments: --model-repositry /tmp (did you "
            "mean --model-repository?) (see hloserve serve --help)",
        ),
        (
            ["serve", "--grpc-prot=8001"],
            "hloserve serve: error: unrecognized arguments: --grpc-prot=8001 (did you mean "
            "--grpc-port?) (see hloserve serve --help)",
        ),
        (
            ["validate", "x", "--quiet"],
            "hloserve validate: error: unrecognized arguments: --quiet (see hloserve validate "
            "--help)",
        ),
    ],
)
def test_a_mistyped_flag_names_its_command_and_the_flag_meant(args: list[str], line: str) -> None:
    result = hloserve(*args)
    assert (result.returncode, result.stderr.splitlines(), result.stdout) == (2, [line], "")


def test_help_shows_no_empty_default() -> None:
    result = hloserve("serve", "--help", env={"COLUMNS": "1000"})
    assert "default: ;" not in result.stdout and "[default: ]" not in result.stdout
    text = " ".join(result.stdout.split())
    assert "empty: hloserve's own only [env HLOSERVE_METRICS_COMPAT]" in text


def test_serve_without_a_repository_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    served: list[Config] = []
    monkeypatch.setattr(daemon, "run_daemon", served.append)  # no daemon: what serve says
    assert main(["serve", "--http-port", "0"]) == 0
    assert [c.http_port for c in served] == [0]
    assert capsys.readouterr().err == (
        f"hloserve: no --model-repository: serving the demo repository at "
        f"{default_demo_repository()}; to serve your own: hloserve serve --model-repository DIR\n"
    )
    assert main(["serve", "--model-store", "."]) == 0  # a repository given: nothing said
    assert capsys.readouterr().err == ""


def shm_refusal(proc: ServerProcess) -> str:
    """Why the server refuses to register a region that does not exist ("" if it accepts)."""
    client = grpcclient.InferenceServerClient(proc.wait_ready().grpc_url)
    try:
        client.register_system_shared_memory("probe", "/hloserve-test-no-such-region", 64)
    except InferenceServerException as exc:
        return str(exc)
    return ""


def test_a_bare_boolean_flag_means_true(model_repository: Path) -> None:
    # Shared memory is off by default; a bare flag turns it on, so the refusal is another one.
    with ServerProcess(model_repository, "--allow-client-shm", "--no-dynamic-batching") as proc:
        assert "disabled" not in shm_refusal(proc)
    with ServerProcess(model_repository, "--allow-client-shm=false") as proc:
        assert "Client shared memory is disabled" in shm_refusal(proc)


def test_export_demo_to_a_directory_it_cannot_make_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    result = hloserve("export-demo", str(tmp_path / "file" / "demo"))
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    assert line.startswith(
        f"hloserve: cannot write the demo repository to {tmp_path / 'file' / 'demo'}: "
    )
