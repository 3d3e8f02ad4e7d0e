"""`make bench`: every benchmark, each reporting against its peer or limit measured in the
same run. `python -m bench NAME...` runs only the named ones."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

BENCHES = {
    "startup": "bench.startup_bench",
    "storage": "bench.storage_bench",
    "pulsar": "bench.pulsar_bench",
    "kafka": "bench.kafka_bench",
    "amqp": "bench.amqp_bench",
    "mqtt": "bench.mqtt_bench",
    "spark": "bench.spark_bench",
}


def main(argv: list[str]) -> int:
    names = argv or list(BENCHES)
    results = {}
    for name in names:
        module = importlib.import_module(BENCHES[name])
        results[name] = module.run()
    out = Path("bench/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.json").write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
