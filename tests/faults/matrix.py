"""Render the rows recorded by a fault-suite run ($FAULTS_RECORD, JSON lines) as the
markdown tables of docs/reliability.md:

    FAULTS_SCALE=full FAULTS_RECORD=/tmp/matrix.jsonl .venv/bin/python -m pytest -m faults -q -s
    .venv/bin/python -m tests.faults.matrix /tmp/matrix.jsonl
"""

from __future__ import annotations

import json
import sys


def render(lines: list[str]) -> str:
    rows = [json.loads(line) for line in lines if line.strip()]
    out = ["| fault | injected | events | sink | alerts expected | delivered | lost | duplicated | unexpected |",
           "|---|---|---|---|---|---|---|---|---|"]
    commands = []
    for row in rows:
        if row.get("fuzz"):
            continue
        for sink, r in row["sinks"].items():
            out.append(f"| {row['fault']} | {row['injected']} | {row['events']} | {sink} | {r['expected']} | "
                       f"{r['delivered']} | {r['lost']} | {r['duplicated']} | {r['unexpected']} |")
        commands.append(f"- {row['fault']}: `{row['command']}`")
    fuzz = [row for row in rows if row.get("fuzz")]
    text = "\n".join(out) + "\n\nReproduce one row:\n\n" + "\n".join(commands) + "\n"
    for row in fuzz:
        text += (f"\nFuzzing: {row['examples']} examples -> {row['messages']} messages; categories "
                 f"{json.dumps(row['categories'])}; rejects expected {row['expected_rejects']}, dead-lettered "
                 f"{row['dead_letters']}; alerts expected {row['expected_alerts']}, fired {row['alerts']}; "
                 f"worker crashes {row['crashes']}.\n")
    return text


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        print(render(fh.readlines()))
