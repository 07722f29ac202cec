"""scripts/bench_router.py's driver leaves no process behind when a start fails (its helpers run
in their own sessions, so nothing else would stop them)."""

from __future__ import annotations

import runpy
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.e2e

BENCH = SimpleNamespace(**runpy.run_path(str(Path(__file__).resolve().parents[2] / "scripts" / "bench_router.py")))


def test_a_router_that_does_not_start_leaves_no_upstream_running(tmp_path: Path) -> None:
    args = SimpleNamespace(load_core=None, router_core=None, chunks=1, chunk_interval_ms=1.0, replicas=1,
                           router_cmd="false", router_arg=[], baseline_cmd=None)   # `false router ...` exits
    bench = BENCH.Bench(args, tmp_path)
    with pytest.raises(SystemExit, match="router did not start"):
        bench.run()
    assert len(bench.procs) == 2                    # the upstream, then the router that failed
    assert all(p.poll() is not None for p in bench.procs), "a helper process is still running"


# A stand-in for another project's router (vllm-router, sglang-router): answers every POST with
# 200 on the port the bench gives it, as those peers do once their worker is healthy.
_PEER = ("{python} -c \"import http.server as h\n"
         "class H(h.BaseHTTPRequestHandler):\n"
         "    def do_POST(self):\n"
         "        self.rfile.read(int(self.headers['Content-Length']))\n"
         "        self.send_response(200); self.send_header('Content-Length', '2'); self.end_headers()\n"
         "        self.wfile.write(b'ok')\n"
         "h.HTTPServer(('127.0.0.1', {{port}}), H).serve_forever()\"")


def test_a_peer_router_is_started_on_its_port_and_ready_when_it_answers(tmp_path: Path) -> None:
    args = SimpleNamespace(router_core=None)
    bench = BENCH.Bench(args, tmp_path)
    try:
        url, pid = bench.start_peer("stand-in", _PEER.format(python=sys.executable), "http://127.0.0.1:1")
        assert pid == bench.procs[0].pid
        with urllib.request.urlopen(urllib.request.Request(url + "/v1/chat/completions", data=b"{}"),
                                    timeout=5) as r:
            assert r.status == 200
    finally:
        bench.close()
    assert all(p.poll() is not None for p in bench.procs)


def test_a_peer_that_exits_is_reported_with_its_log(tmp_path: Path) -> None:
    args = SimpleNamespace(router_core=None)
    bench = BENCH.Bench(args, tmp_path)
    with pytest.raises(SystemExit, match="peer gone did not start: no such worker"):
        bench.start_peer("gone", "sh -c 'echo no such worker {upstream} >&2; exit 3'", "http://127.0.0.1:1")
    bench.close()


@pytest.mark.parametrize("spec", ["vllm-router", "=cmd", "router=cmd", "baseline=cmd", "x= "])
def test_a_malformed_peer_is_refused_before_anything_starts(spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        BENCH.main(["--peer", spec])
    assert exc.value.code == 2
    assert "--peer wants NAME=CMD" in capsys.readouterr().err
