"""Load benchmark: prepare with 4 webhook contributors answering in 10 ms, Redis store.

For 1 and 2 service workers (Redis shared store), at concurrency 1, 16 and 64: requests per
second, p50, p99 and error rate. Loopback only, bounded (a fixed number of requests per point),
every process stopped at the end. The load generator, the contributor server and the service all
share the machine's two cores: read the figures as what this machine does end to end.
Run: ``make bench`` or ``.venv/bin/python bench/bench_load.py``.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
import time
from pathlib import Path

import orjson
import redis
from context_assembly_client.testing import start_service
from load_client import load, pct, run
from loopback import start_loopback_contributor

REQUESTS = {1: 150, 16: 600, 64: 900}


def request_body() -> bytes:
    names = [f"c{i}" for i in range(4)]
    return orjson.dumps(
        {
            "model": "gpt-4o-mini",
            "instructions": "Be exact.",
            "assembly": {"max_data_tokens": 2000, "timeout_ms": 2000},
            "plugins": [{"name": name} for name in names],
            "contributors": [{"source": name, "endpoint": name} for name in names],
            "input": [{"role": "user", "content": "What changed?"}],
        }
    )


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="ca-load-"))
    prefix = f"ca-load-{secrets.token_hex(4)}:"
    contributor = start_loopback_contributor(10)
    body = request_body()
    try:
        print("prepare with 4 contributors answering in 10 ms, Redis store")
        print(
            f"{'workers':>7} {'c':>4} {'n':>5} {'rps':>7} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}"
        )
        for workers in (1, 2):
            lines = [
                "[store]",
                'backend = "redis"',
                'redis_url = "redis://127.0.0.1:6379/13"',
                f'key_prefix = "{prefix}"',
                "",
            ]
            for i in range(4):
                lines += [
                    f"[contributors.c{i}]",
                    f'url = "http://127.0.0.1:{contributor.port}/c{i}"',
                    "",
                ]
            config = folder / f"load-{workers}.toml"
            config.write_text("\n".join(lines))
            service = start_service(config, "--workers", str(workers))
            url = f"{service.url}/v1/prepare"
            try:
                run(load(url, body, 8, 80))  # warm every worker
                for concurrency, total in REQUESTS.items():
                    started = time.perf_counter()
                    latencies, errors = run(load(url, body, concurrency, total))
                    elapsed = time.perf_counter() - started
                    print(
                        f"{workers:>7} {concurrency:>4} {total:>5} {total / elapsed:>7.0f} "
                        f"{pct(latencies, 0.5):>8.1f} {pct(latencies, 0.99):>8.1f} {errors / total:>7.1%}"
                    )
            finally:
                service.stop()
    finally:
        contributor.stop()
        shutil.rmtree(folder, ignore_errors=True)
        client = redis.Redis.from_url("redis://127.0.0.1:6379/13")
        for key in client.scan_iter(f"{prefix}*"):
            client.delete(key)
        client.close()


if __name__ == "__main__":
    main()
