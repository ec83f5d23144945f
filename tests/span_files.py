"""An OpenTelemetry SDK exporter that appends each finished span as a JSON line to a file of its
process, and the reader tests use to collect them from every process (tests/tracing_settings.py).

One file per process id: runconsumer's workers are forked, and each writes its own file, so no two
processes ever append to one file.
"""
import json
import os
from pathlib import Path

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


class JsonLinesExporter(SpanExporter):
    def __init__(self, directory):
        self.directory = Path(directory)

    def export(self, spans):
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / f"spans-{os.getpid()}.jsonl", "a") as out:
            for span in spans:
                out.write(span.to_json(indent=None) + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass


def read_spans(directory):
    """Every span the processes exported to ``directory`` so far, as dicts (SDK's ReadableSpan.to_json)."""
    spans = []
    for path in sorted(Path(directory).glob("spans-*.jsonl")):
        for line in path.read_text().splitlines():
            if line.endswith("}"):  # a line being written is read at the next look
                spans.append(json.loads(line))
    return spans
