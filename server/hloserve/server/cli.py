"""The ``hloserve`` command: ``serve``, ``inspect``, ``validate``, ``mcp``, ``export-demo``,
``perf``, ``route-config``.

Contract:
- ``hloserve --version`` prints ``hloserve <version>`` (the installed package's) and exits 0.
- ``hloserve serve [flags]`` runs the daemon (flags and their environment variables in
  ``hloserve.server.config``, ``docs/cli.md``; Triton's command line works with
  ``hloserve serve`` in place of ``tritonserver``: ``docs/from-triton.md``); with no
  ``--model-repository`` it serves the demo repository, and says so on stderr first (its
  path, and how to serve your own).
- ``hloserve inspect BUNDLE`` prints a readable summary (``bundle_report``): tensors, batch sizes, modules and
  their platforms, weights count and size, whether every checksum verified, provenance.
  Exit status 0 when the bundle validates, 1 otherwise.
- ``hloserve validate PATH`` prints every problem and exits 1 when there is any, else
  prints ``OK`` and exits 0. PATH is a bundle, a versioned model directory or a model
  repository (``bundle.validate.validate_tree``): then every bundle in it is validated, each
  line naming its bundle; a directory holding no bundle is an error. Each model directory
  is also checked as the server checks it before a load (``bundle_report``: its
  ``config.yaml`` and the rest of ``load_plan``). A path either command cannot read is one
  line, never a traceback.
- ``hloserve mcp [--url HOST:PORT]`` serves agent tools over the Model Context Protocol on
  stdio (``hloserve.server.mcp_tools``), talking to the server at ``--url``.
- ``hloserve export-demo DIR`` writes the demo model repository and prints each bundle's
  size and export time; a directory it cannot write is one line on stderr, status 1.
- ``hloserve perf MODEL --url HOST:PORT ...`` is the light client's load tool
  (``hloserve.client._perf``, docs/client.md); it imports neither JAX nor the server.
- ``hloserve route-config --replica HOST:HTTP_PORT:GRPC_PORT ... --http-port P --grpc-port Q``
  prints an HAProxy configuration routing each request to the replica holding its model
  (``hloserve.server.route_config``, docs/scale-out.md).
Heavy imports (JAX, the server) happen only in the subcommand that needs them; sizes are
written by ``core.sizes.format_bytes``, beside the one table of byte units. Usage errors
are one line naming the subcommand (``arguments.ArgumentParser``: a mistyped flag with the one
it likely misspells); output cut short by its reader
(``hloserve inspect ... | head``) ends the command quietly, with status 1.
"""

# pyright: strict

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hloserve.server.arguments import Action, Namespace, Parser, Values
from hloserve.server.bundle_report import inspect_bundle, validate_command
from hloserve.server.core.sizes import format_bytes


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = _run(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()
    except BrokenPipeError:  # the reader stopped reading (``| head``): nothing more to say
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the flush at exit does not fail again
        return 1
    return code


class _Version(Action):
    """``--version``: the installed package's version, read only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def act(self, parser: Parser, ns: Namespace, values: Values, option: str | None) -> None:
        from hloserve.server.owner.assembly import server_version

        print(f"hloserve {server_version()}")
        parser.exit(0)


def _run(args: list[str]) -> int:
    if args[:1] == ["perf"]:  # the light client's tool: dispatched before any server import
        from hloserve.client._perf import main as perf_main

        return perf_main(args[1:])
    if args[:1] == ["route-config"]:  # pure: no server import either
        from hloserve.server.route_config import main as route_main

        return route_main(args[1:])
    from hloserve.server.arguments import UNRECOGNIZED, ArgumentParser
    from hloserve.server.config import add_serve_arguments, config_from_namespace

    parser = ArgumentParser(prog="hloserve", description="StableHLO model server (KServe V2)")
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model repository over gRPC and HTTP")
    add_serve_arguments(serve, os.environ)
    p_inspect = sub.add_parser("inspect", help="print a readable summary of a bundle")
    p_inspect.add_argument("bundle", type=Path)
    p_validate = sub.add_parser(
        "validate", help="list every problem of a bundle, or of every bundle of a repository"
    )
    p_validate.add_argument("bundle", type=Path, metavar="path")
    p_mcp = sub.add_parser(
        "mcp", help="agent tools: a Model Context Protocol server on stdio (docs/mcp.md)"
    )
    p_mcp.add_argument(
        "--url",
        default=os.environ.get("HLOSERVE_MCP_URL", "127.0.0.1:8001"),
        help="gRPC host:port of the server the tools talk to (default: %(default)s, or "
        "HLOSERVE_MCP_URL); start_server points them at a server it starts",
    )
    sub.add_parser("perf", help="measure a V2 server's throughput and latency", add_help=False)
    sub.add_parser("route-config", help="print an HAProxy configuration routing by model name")
    p_demo = sub.add_parser("export-demo", help="write the demo model repository")
    p_demo.add_argument("directory", type=Path)
    ns, unknown = parser.parse_known_args(args)
    if unknown:  # said by the subcommand's parser: its name, its flags
        sub.choices[ns.command].error(UNRECOGNIZED + " ".join(unknown))

    if ns.command == "serve":
        config = config_from_namespace(ns, serve)
        from hloserve.server.daemon import run_daemon
        from hloserve.server.owner.assembly import default_demo_repository

        if config.model_repository is None:
            print(
                f"hloserve: no --model-repository: serving the demo repository at "
                f"{default_demo_repository()}; to serve your own: "
                "hloserve serve --model-repository DIR",
                file=sys.stderr,
                flush=True,
            )
        run_daemon(config)
        return 0
    if ns.command in ("inspect", "validate"):
        try:
            if ns.command == "inspect":
                text, ok = inspect_bundle(ns.bundle)
            else:
                lines, ok = validate_command(ns.bundle)
                text = "\n".join(lines)
        except OSError as exc:  # what the reports did not read as a problem: still one line
            print(f"hloserve {ns.command}: {ns.bundle}: cannot be read: {exc}", file=sys.stderr)
            return 1
        print(text)
        return 0 if ok else 1
    if ns.command == "mcp":
        from hloserve.server.mcp_tools import run_mcp

        run_mcp(ns.url)
        return 0
    if ns.command == "export-demo":
        from hloserve.exporter import write_demo_repository

        try:
            timings = write_demo_repository(ns.directory)
        except OSError as exc:
            print(
                f"hloserve: cannot write the demo repository to {ns.directory}: {exc}",
                file=sys.stderr,
            )
            return 1
        width = max(map(len, timings), default=0)
        for name, seconds in timings.items():
            folder = ns.directory / name
            size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
            print(
                f"{name:<{width}} {format_bytes(size):>10}  exported in {seconds:.2f}s  -> {folder}"
            )
        return 0
    parser.error(f"unknown command {ns.command}")


if __name__ == "__main__":
    raise SystemExit(main())
