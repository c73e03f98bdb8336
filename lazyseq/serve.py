"""``python -m lazyseq.serve MODULE:ATTR``: serve a pipeline defined in a module, until Ctrl-C or SIGTERM.

``ATTR`` names a view (or any sequence, or an iterable) at the top level of
``MODULE`` (no dots: ``data:train``, not ``data:splits.train``), or a
function of no arguments that returns one. The address the server listens at
is printed on the first line of the standard output (with the real port when
``--address`` asks for port 0), then the server runs until it is interrupted.

    python -m lazyseq.serve my_project.data:train_batches --address tcp://127.0.0.1:5557 --nworkers 4

Binding to an address other machines can reach needs CURVE keys: ``--keys
DIR`` reads ``DIR/server.key_secret`` (made with
``zmq.auth.create_certificates(DIR, "server")`` in a directory that exists,
then made readable by its owner alone) and lets in the clients whose public
key files (``*.key``) are in ``DIR/clients``; ``--insecure`` binds without
them. Stop it with Ctrl-C or SIGTERM (a background job of a shell script
ignores SIGINT: send SIGTERM); a second one stops it without waiting for the
items its workers are computing.

This module is a command, not a library: use :func:`lazyseq.serve` in code.
Importing it (``import lazyseq.serve``, as documentation tools do) makes it
the package's ``serve``; calling it then calls the function all the same.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import os
import signal
import stat
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CLI_WAYS = ("give --keys DIR (its server.key_secret, and clients/*.key for the clients let in)", "pass --insecure")


class _CallableModule(types.ModuleType):
    """This module, callable as :func:`lazyseq.serve`: importing it replaces the package's ``serve`` with it."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from .serving.server import serve

        return serve(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule


def load_source(spec: str) -> Any:
    """What ``MODULE:ATTR`` names, called if it is a function (a view or a class is served as it is)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"lazyseq.serve: expected MODULE:ATTR (e.g. my_project.data:train), got {spec!r}")
    if "/" in module_name or os.sep in module_name or (module_name.endswith(".py") and os.path.isfile(module_name)):
        path = os.path.normpath(module_name).removesuffix(".py")
        outside = os.path.isabs(path) or path.startswith(os.pardir + os.sep)  # (not a module path from here)
        name = os.path.basename(path) if outside else path.replace(os.sep, ".")
        where = f" (from {os.path.dirname(path)}, or with it on PYTHONPATH)" if outside else ""
        raise SystemExit(
            f"lazyseq.serve: {spec!r} names a file: name its module and attribute as python -m would{where}, "
            f"e.g. {name}:{attr}"
        )
    sys.path.insert(0, "")  # modules in the current directory, as with python -m
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is None or not f"{module_name}.".startswith(f"{error.name}."):  # one the module imports: where
            raise
        raise SystemExit(f"lazyseq.serve: cannot import {module_name!r}: {error}") from None
    try:
        source = getattr(module, attr)
    except AttributeError:
        raise SystemExit(f"lazyseq.serve: module {module_name!r} has no attribute {attr!r}") from None
    from .views.base import View

    if isinstance(source, type):
        raise SystemExit(
            f"lazyseq.serve: {spec} is a class: name an instance of it in {module_name} (a view, a dataset), or a "
            "function that takes no arguments and returns one"
        )
    if callable(source) and not isinstance(source, View):
        try:
            inspect.signature(source).bind()
        except TypeError as error:  # it needs arguments: say so, without a traceback
            raise SystemExit(
                f"lazyseq.serve: {spec} is a function that needs arguments ({error}); name a view, or a function "
                "that takes none and returns one"
            ) from None
        except ValueError:  # no signature to read (a builtin): called as it is
            pass
        source = source()
        if source is None:
            raise SystemExit(f"lazyseq.serve: {spec}() returned None: it should return a view (or an iterable)")
    return source


def read_keys(directory: str) -> tuple[tuple[bytes, bytes], list[bytes]]:
    """The server's key pair and the allowed clients' public keys, from certificate files in ``directory``."""
    from .serving.security import is_pair

    root = Path(directory)
    if not (root / "server.key_secret").is_file():
        raise SystemExit(
            f"lazyseq.serve: --keys {directory}: no {root / 'server.key_secret'} (make it with "
            f"os.makedirs({directory!r}); zmq.auth.create_certificates({directory!r}, 'server'), then chmod 600 it, "
            f"and put the clients' public .key files in {root / 'clients'})"
        )
    pair = root / "server.key_secret"
    public, secret = _keys_in(pair)
    if secret is None:
        raise SystemExit(f"lazyseq.serve: {pair} holds no secret key")
    if not is_pair(public, secret):
        raise SystemExit(
            f"lazyseq.serve: {pair}: its public key is not that of its secret key; make the pair again with "
            "zmq.auth.create_certificates"
        )
    mode = stat.S_IMODE((root / "server.key_secret").stat().st_mode)
    if mode & 0o077:  # zmq.auth writes it with the process's umask: usually readable by everyone
        print(
            f"lazyseq.serve: warning: {root / 'server.key_secret'} can be read by other users (mode {mode:o}): "
            f"whoever reads it can pose as this server; chmod 600 it",
            file=sys.stderr,
        )
    clients = [_keys_in(path)[0] for path in sorted((root / "clients").glob("*.key"))]
    if not clients:
        print(
            f"lazyseq.serve: warning: --keys {directory}: no {root / 'clients' / '*.key'}: no client will be let in",
            file=sys.stderr,
        )
    return (public, secret), clients


def _keys_in(path: Path) -> tuple[bytes, bytes | None]:
    """The public key and the secret one (None in a public key file) in a file that zmq.auth wrote."""
    import zmq.auth

    try:
        public, secret = zmq.auth.load_certificate(path)
    except (ValueError, OSError) as error:
        raise SystemExit(
            f"lazyseq.serve: {path} is not a key file as zmq.auth.create_certificates writes: {error}"
        ) from None
    for key in (public, secret):
        if key is not None and len(key) != 40:
            raise SystemExit(f"lazyseq.serve: {path} holds a key that is not 40 Z85 characters: {key!r:.60}")
    return public, secret


def _as_ctrl_c(signum: int, frame: Any) -> None:
    """SIGTERM, handled as SIGINT is now (closing a server defers a Ctrl-C until what it releases is released)."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:  # ignored (a background job of a shell script): SIGTERM still stops it
        signal.default_int_handler(signal.SIGINT, frame)


def main(argv: Sequence[str] | None = None) -> None:
    description = (
        "Serve a pipeline defined in a module until Ctrl-C or SIGTERM; the address it listens at is printed on "
        "the first line of the standard output (what the module prints as it loads goes to the standard error)."
    )
    parser = argparse.ArgumentParser(prog="python -m lazyseq.serve", description=description)
    parser.add_argument("source", help="MODULE:ATTR, a view (or an iterable) or a function returning one")
    parser.add_argument(
        "--address",
        default="tcp://127.0.0.1:5557",
        help="where to listen: tcp://HOST:PORT (port 0: any free one) or ipc://PATH (default: %(default)s)",
    )
    parser.add_argument(
        "--nworkers",
        type=int,
        default=0,
        help="workers computing items ahead (0, the default: one thread; -n: all cores but n)",
    )
    parser.add_argument(
        "--method", choices=["thread", "process", "ray"], default="thread", help="what the workers are (%(default)s)"
    )
    parser.add_argument(
        "--max-buffered", type=int, default=None, help="items computed ahead of each consumer (as lazyseq.prefetch)"
    )
    parser.add_argument("--keys", help="a directory with server.key_secret and clients/*.key (CURVE)")
    parser.add_argument("--insecure", action="store_true", help="allow a public address without CURVE keys")
    args = parser.parse_args(argv)

    from .serving.endpoints import check_endpoint
    from .serving.security import check_address
    from .serving.server import serve

    # SIGTERM as Ctrl-C from the start: a server stopped while it starts (Ray's, say) goes as it would once serving,
    # and a second one stops it without waiting for its workers
    signal.signal(signal.SIGTERM, _as_ctrl_c)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # the address is the first line of the standard output
            source = load_source(args.source)
        try:  # what the user gave is wrong: the message says what, no traceback
            keypair, clients = read_keys(args.keys) if args.keys else (None, None)
            check_address(check_endpoint(args.address, "serve", binding=True), keypair, args.insecure, ways=CLI_WAYS)
        except (ValueError, OSError) as error:
            raise SystemExit(f"lazyseq.serve: {str(error).removeprefix('serve: ')}") from None
        try:  # serve's own checks say what is wrong in a line; the pipeline's errors keep their traceback
            server = serve(
                source,
                args.address,
                nworkers=args.nworkers,
                method=args.method,
                max_buffered=args.max_buffered,
                curve_keypair=keypair,
                allowed_clients=clients,
                insecure=args.insecure,
            )
        except (ValueError, TypeError, OSError, ImportError) as error:  # ImportError: pyzmq or Ray missing
            said = str(error)
            if not (said.startswith("serve: ") or isinstance(error, ImportError)):  # the pipeline's own: where
                raise
            raise SystemExit(f"lazyseq.serve: {said.removeprefix('serve: ')}") from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None  # (stopped before it served: as an interrupted command does)
    try:  # an interrupt from the moment the server exists ends it quietly, even one that comes while printing
        print(server.address, flush=True)
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


if __name__ == "__main__":
    main()
