"""One line per simulated card from ``bench_lowvram.py --card-sizes`` output on stdin (its JSON rows), for a lent
machine's short output: fits, step times, streamed GiB per step, each phase's seconds and peak, the failure."""

import json
import sys


def main() -> None:
    for line in sys.stdin:
        if not line.startswith("{"):
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a log line that happens to start with "{"
            continue
        sample = row.get("sample", {})
        steps = {k: v for k, v in sample.items() if k.startswith(("step_s", "first", "projected", "graphs"))}
        phases = {k: (row[k].get("seconds"), row[k].get("peak_gib"))
                  for k in ("text_encode", "sample", "vae_decode", "sound_decode") if k in row}
        print(row["case"], "fits" if row.get("fits") else "DOES NOT FIT", f"init {row.get('init_s')} s",
              f"before {row.get('allocated_before_gib')} GiB", f"streamed {row.get('streamed_gib_per_step')} GiB",
              steps, phases, row.get("error", ""), row.get("where", ""))


if __name__ == "__main__":
    main()
