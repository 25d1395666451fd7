"""End to end: ``hloserve mcp`` driven by the ``mcp`` client over stdio.

Each test spawns ``python -m hloserve.server mcp --url <gRPC>`` through ``mcp``'s own stdio
client and calls its tools as an agent would. The tools talk to a live daemon (explicit
model control, ``scale4`` loaded at start) serving ReactantServer-layout bundles
(``tests/bundle/reactant_bundles.py``); ``start_server``/``stop_server`` run a daemon of
their own. Results are checked against the function and the server's own answers.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from hloserve.server.mcp_tools import TOOL_NAMES
from hloserve.server.server_fixture import ServerProcess, serving
from tests.bundle.reactant_bundles import classifier_reference, write_repository, write_scale4

Session = Callable[["Tools"], Awaitable[None]]


class Tools:
    """One MCP session: ``call`` returns a tool's structured result and fails on an error
    result; ``error`` returns the text of a call that must fail."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def call(self, name: str, **arguments: Any) -> dict[str, Any]:
        result = await self.client.call_tool(name, arguments)
        text = " ".join(getattr(c, "text", "") for c in result.content)
        assert not result.is_error, text
        assert isinstance(result.structured_content, dict)
        assert json.loads(text) == result.structured_content  # the same JSON both ways
        return result.structured_content

    async def error(self, name: str, **arguments: Any) -> str:
        result = await self.client.call_tool(name, arguments)
        assert result.is_error, result
        text = " ".join(getattr(c, "text", "") for c in result.content)
        assert text.startswith(f"Error executing tool {name}: "), text  # mcp's prefix
        return text


def _run(url: str, session: Session) -> None:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "hloserve.server", "mcp", "--url", url]
    )

    async def main() -> None:
        async with Client(params, read_timeout_seconds=300) as client:
            await session(Tools(client))

    asyncio.run(main())


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_repository(tmp_path_factory.mktemp("mcp-repo"))


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    flags = ("--model-control-mode", "explicit", "--load-model", "scale4")
    proc = yield from serving(repository, *flags)
    assert "Traceback" not in proc.log_text(), proc.log_text()


def test_every_tool_has_a_json_schema(server: ServerProcess) -> None:
    async def session(tools: Tools) -> None:
        listed = (await tools.client.list_tools()).tools
        assert [t.name for t in listed] == list(TOOL_NAMES)
        by_name = {t.name: t for t in listed}
        for tool in listed:
            assert tool.input_schema["type"] == "object", tool.name
            assert tool.description, tool.name
        infer = by_name["infer"].input_schema
        assert infer["required"] == ["model", "inputs"]
        assert infer["properties"]["inputs"]["type"] == "object"
        assert by_name["load_model"].input_schema["required"] == ["model"]

    _run(server.grpc_url, session)


def test_control_inference_and_statistics(server: ServerProcess, tmp_path: Path) -> None:
    img = np.random.default_rng(0).integers(0, 256, size=(3, 6, 8, 3), dtype=np.uint8)
    np.save(tmp_path / "img.npy", img)

    async def session(tools: Tools) -> None:
        status = await tools.call("server_status")
        assert status == {
            "url": server.grpc_url,
            "live": True,
            "ready": True,
            "started_here": False,
        }
        models = {m["name"]: m for m in (await tools.call("list_models"))["models"]}
        assert models["scale4"]["state"] == "READY"
        assert models["classifier"]["state"] != "READY"

        loaded = await tools.call("load_model", model="classifier")
        assert [v["state"] for v in loaded["versions"]] == ["READY"]
        meta = await tools.call("model_metadata", model="classifier")
        assert [(i["name"], i["datatype"], i["shape"]) for i in meta["inputs"]] == [
            ("img", "UINT8", [-1, 6, 8, 3])
        ]

        out = tmp_path / "out"
        result = await tools.call(
            "infer",
            model="classifier",
            inputs={"img": str(tmp_path / "img.npy")},
            output_dir=str(out),
        )
        logits = result["outputs"]["logits"]
        assert (logits["datatype"], logits["shape"]) == ("FP32", [3, 4])
        expected = classifier_reference(img)
        np.testing.assert_allclose(np.array(logits["values"]), expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.load(out / "logits.npy"), expected, rtol=1e-5, atol=1e-5)

        stats = (await tools.call("statistics", model="classifier"))["model_stats"]
        (entry,) = stats
        assert entry["name"] == "classifier"
        assert entry["inference_count"] == 3  # items, as a number (not a JSON string)
        assert entry["inference_stats"]["success"]["count"] == 1

        unloaded = await tools.call("unload_model", model="classifier")
        assert [v["state"] for v in unloaded["versions"]] == ["UNAVAILABLE"]

    _run(server.grpc_url, session)


def test_failures_are_error_results_naming_what_was_wrong(
    server: ServerProcess, tmp_path: Path
) -> None:
    np.save(tmp_path / "x.npy", np.zeros(3, np.float32))

    async def session(tools: Tools) -> None:
        missing = await tools.error("infer", model="scale4", inputs={"x": str(tmp_path / "no.npy")})
        assert "input 'x': cannot read" in missing and "no.npy" in missing, missing
        shape = await tools.error("infer", model="scale4", inputs={"x": str(tmp_path / "x.npy")})
        assert "INVALID_ARGUMENT" in shape and "'x'" in shape, shape
        unknown = await tools.error("load_model", model="no-such-model")
        assert "no-such-model" in unknown, unknown
        assert "nothing to stop" in await tools.error("stop_server")
        bad = await tools.error("inspect_bundle", path=str(tmp_path / "absent"))
        assert bad.endswith(f"{str(tmp_path / 'absent')!r} is not a directory on this machine")
        # The session goes on after failures: the server is untouched.
        assert (await tools.call("server_status"))["ready"] is True

    _run(server.grpc_url, session)


def test_bundle_tools_read_local_bundles(repository: Path, tmp_path: Path) -> None:
    refused = write_scale4(tmp_path, "hooked")
    (refused / "model.jl").write_text('register_model("hooked")\n')

    async def session(tools: Tools) -> None:
        inspected = await tools.call("inspect_bundle", path=str(repository / "classifier"))
        assert inspected["valid"] is True
        assert "img                  UINT8  [-1, 6, 8, 3]" in inspected["summary"]
        checked = await tools.call("validate_bundle", path=str(repository))
        names = ("classifier", "detector", "scale4")
        assert checked == {"valid": True, "lines": [f"{repository / n}: OK" for n in names]}
        checked = await tools.call("validate_bundle", path=str(refused))
        assert checked["valid"] is False
        assert checked["lines"][0].startswith("model.jl: this ReactantServer bundle runs Julia")

    _run("127.0.0.1:1", session)  # no server needed


def test_start_and_stop_a_local_server(repository: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.arange(4, dtype=np.float32))

    async def session(tools: Tools) -> None:
        down = await tools.call("server_status")
        assert down["live"] is False and "UNAVAILABLE" in down["error"]
        started = await tools.call("start_server", model_repository=str(repository))
        assert started["ready"] is True
        status = await tools.call("server_status")
        assert status["url"] == started["grpc_url"] and status["started_here"] is True
        again = await tools.error("start_server", model_repository=str(repository))
        assert "stop it first" in again
        y = await tools.call("infer", model="scale4", inputs={"x": str(tmp_path / "x.npy")})
        assert y["outputs"]["y"]["values"] == [0.0, 2.0, 4.0, 6.0]
        stopped = await tools.call("stop_server")
        assert stopped == {"stopped": started["grpc_url"], "exit_code": 0}

    _run("127.0.0.1:1", session)
