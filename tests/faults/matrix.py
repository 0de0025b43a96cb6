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
    out = ["| fault | injected | events | sink | alerts expected | delivered | in doubt | lost | duplicated | "
           "unexpected |", "|---|---|---|---|---|---|---|---|---|---|"]
    commands = []
    for row in rows:
        if row.get("fuzz"):
            continue
        for sink, r in row["sinks"].items():
            out.append(f"| {row['fault']} | {row['injected']} | {row['events']} | {sink} | {r['expected']} | "
                       f"{r['delivered']} | {r.get('in_doubt', 0)} | {r['lost']} | {r['duplicated']} | "
                       f"{r['unexpected']} |")
        commands.append(f"- {row['fault']}: `{row['command']}`")
    fuzz = [row for row in rows if row.get("fuzz")]
    text = "\n".join(out) + "\n\nReproduce one row:\n\n" + "\n".join(commands) + "\n"
    audited = [row for row in rows if row.get("audit")]
    if audited:
        text += ("\nThe PySpark audit on the traces of the runs with the recorder on:\n\n"
                 "| fault | trace records | verdict | unaudited windows | alerts expected (audit) | judged ok | "
                 "missed | duplicate | spurious | channel missed | channel duplicate | channel spurious |\n"
                 "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
        for row in audited:
            a = row["audit"]
            windows = a.get("unaudited_windows") or []
            spans = ", ".join(f"{w['seconds']} s ({w['reason']})" for w in windows) or "none"
            text += (f"| {row['fault']} | {row.get('trace_records', '')} | {a['verdict']} | {len(windows)}: {spans} | "
                     f"{a.get('expected_alerts')} | {a.get('verdict_ok', 0)} | {a.get('missed')} | "
                     f"{a.get('duplicate')} | {a.get('spurious')} | {a.get('channel_missed')} | "
                     f"{a.get('channel_duplicate')} | {a.get('channel_spurious')} |\n")
    for row in fuzz:
        text += (f"\nFuzzing: {row['examples']} examples -> {row['messages']} messages; categories "
                 f"{json.dumps(row['categories'])}; rejects expected {row['expected_rejects']}, dead-lettered "
                 f"{row['dead_letters']}; alerts expected {row['expected_alerts']}, fired {row['alerts']}; "
                 f"worker crashes {row['crashes']}.\n")
    return text


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        print(render(fh.readlines()))
