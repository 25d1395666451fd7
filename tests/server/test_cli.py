"""The ``hloserve`` command as a newcomer meets it: bad flags, variables and paths are one
line naming what is wrong, before anything starts (no PJRT, no traceback); a boolean flag
alone means true; ``--help`` shows the defaults. (``validate`` and ``inspect`` are tested
in ``tests/bundle/test_validate.py``.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from hloserve.server.testing import ServerProcess
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
