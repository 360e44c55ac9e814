#!/usr/bin/env python3
"""Reads aiacc's TensorBoard event files (app/tensorboard.h) with TensorBoard's own code, for the C++ test.

Usage: tensorboard_check.py LOGDIR EXPECTED.json
LOGDIR holds the event files (events.out.tfevents.*) of one run. EXPECTED.json:
  {"records": 6,                                   every record of every file, the first included
   "start_wall_time": 1700000000.25,               the first event's wall_time (null: not checked)
   "scalars": {"TAG": [[step, value, wall_time], ...]},
   "texts": {"TAG": [[step, "markdown", wall_time, ["<strong>bold</strong>", ...]], ...]}}
                                                   the list: what the rendered HTML holds (optional);
                                                   a null wall_time or markdown is not checked
Checks, with the pinned tensorboard of scripts/tools_venv.sh:
  1. TensorBoard's record reader (its CRC-checking TFRecord reader, the tensorflow stub's) reads
     every record of every file without a data loss error, and each record parses as an Event;
  2. EventAccumulator (size guidance 0: keep every event) finds file_version 2, the first event's
     wall time, exactly the expected scalar tags with their (step, value as float32, wall_time)
     in order, and the text tags as the text plugin's DT_STRING scalar tensors with the expected
     UTF-8 content;
  3. the text plugin renders each text to HTML (its Markdown renderer, as the dashboard does)
     holding the expected fragments;
  4. the reader behind the dashboards (plugin_event_accumulator, which migrates simple_value to
     the scalars plugin's float32 tensors) gives the scalars plugin the same points, as
     DATA_CLASS_SCALAR, and the text plugin its tags, as DATA_CLASS_TENSOR.
Prints what differs and exits 1; exits 3 when tensorboard cannot be imported (the C++ test fails
then too, naming scripts/setup.sh).
"""
import glob
import json
import os
import struct
import sys

try:
    from tensorboard.backend.event_processing import event_accumulator, plugin_event_accumulator
    from tensorboard.compat.proto import summary_pb2
    from tensorboard.compat.proto import event_pb2, types_pb2
    from tensorboard.compat.tensorflow_stub import errors as stub_errors
    from tensorboard.compat.tensorflow_stub import pywrap_tensorflow as stub
    from tensorboard.plugins.text import text_plugin
    from tensorboard.util import tensor_util
except ImportError as e:
    print(f"tensorboard is not importable by {sys.executable}: {e}; "
          "run scripts/setup.sh (scripts/tools_venv.sh installs it into .venv-tools/)", file=sys.stderr)
    sys.exit(3)

problems = []


def check(cond, what):
    if not cond:
        problems.append(what)
    return cond


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def untimed(got, exp):
    """got, with the wall time (the last element) of each point dropped where exp's is null (not checked)."""
    return [g[:-1] + (None,) if e[-1] is None else g for g, e in zip(got, exp)] + got[len(exp):]


def read_records(path):
    """Every record of one file through TensorBoard's CRC-checking reader."""
    reader = stub.PyRecordReader_New(path)
    records = []
    while True:
        try:
            reader.GetNext()
        except stub_errors.OutOfRangeError:
            return records
        except stub_errors.DataLossError as e:
            problems.append(f"{os.path.basename(path)}: record {len(records)}: {e}")
            return records
        records.append(reader.record())


def main():
    logdir, expected_path = sys.argv[1], sys.argv[2]
    with open(expected_path, encoding="utf-8") as f:
        want = json.load(f)
    files = sorted(glob.glob(os.path.join(logdir, "*tfevents*")))
    if not check(files, f"no event files in {logdir}"):
        return
    n = 0
    for path in files:
        for i, rec in enumerate(read_records(path)):
            event = event_pb2.Event.FromString(rec)
            if i == 0:
                check(event.file_version == "brain.Event:2", f"first event's file_version {event.file_version!r}")
            n += 1
    check(n == want["records"], f"{n} records, expected {want['records']}")

    acc = event_accumulator.EventAccumulator(
        logdir, size_guidance={k: 0 for k in event_accumulator.DEFAULT_SIZE_GUIDANCE})
    acc.Reload()
    check(acc.file_version == 2.0, f"file_version {acc.file_version}")
    check(want["start_wall_time"] is None or acc.FirstEventTimestamp() == want["start_wall_time"],
          f"first event wall_time {acc.FirstEventTimestamp()!r}, expected {want['start_wall_time']!r}")
    tags = acc.Tags()
    check(sorted(tags["scalars"]) == sorted(want["scalars"]), f"scalar tags {tags['scalars']}")
    for tag, points in want["scalars"].items():
        if tag not in tags["scalars"]:
            continue
        got = [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)]
        exp = [(s, f32(v), t) for s, v, t in points]
        check(untimed(got, exp) == exp, f"scalars {tag!r}: got {got}, expected {exp}")

    try:
        text_tags = sorted(acc.PluginTagToContent("text"))
    except KeyError:  # no summary of the text plugin at all
        text_tags = []
    check(text_tags == sorted(want["texts"]), f"text plugin tags {text_tags}")
    for tag, points in want["texts"].items():
        if not check(tag in tags["tensors"], f"no tensor summary {tag!r} (tensor tags {tags['tensors']})"):
            continue
        check(acc.SummaryMetadata(tag).plugin_data.plugin_name == "text", f"{tag!r}: plugin_name")
        events = acc.Tensors(tag)
        check(untimed([(e.step, e.wall_time) for e in events], [(p[0], p[2]) for p in points]) ==
              [(p[0], p[2]) for p in points],
              f"texts {tag!r}: steps and wall times {[(e.step, e.wall_time) for e in events]}")
        for e, (step, text, _, *fragments) in zip(events, points):
            tp = e.tensor_proto
            check(tp.dtype == types_pb2.DT_STRING, f"{tag!r} step {step}: dtype {tp.dtype}")
            check(len(tp.tensor_shape.dim) == 0, f"{tag!r} step {step}: shape {tp.tensor_shape}")
            if not check(len(tp.string_val) == 1, f"{tag!r} step {step}: {len(tp.string_val)} strings"):
                continue
            got = tp.string_val[0].decode("utf-8")
            check(text is None or got == text, f"{tag!r} step {step}: text {got!r}, expected {text!r}")
            html = text_plugin.text_array_to_html(tensor_util.make_ndarray(tp), enable_markdown=True)
            for fragment in fragments[0] if fragments else []:
                check(fragment in html, f"{tag!r} step {step}: {fragment!r} not in the rendered HTML {html!r}")

    pacc = plugin_event_accumulator.EventAccumulator(
        logdir, size_guidance={k: 0 for k in plugin_event_accumulator.DEFAULT_SIZE_GUIDANCE}, tensor_size_guidance={})
    pacc.Reload()
    for plugin, expected, data_class in (("scalars", want["scalars"], summary_pb2.DATA_CLASS_SCALAR),
                                         ("text", want["texts"], summary_pb2.DATA_CLASS_TENSOR)):
        try:
            got_tags = sorted(pacc.PluginTagToContent(plugin))
        except KeyError:
            got_tags = []
        if not check(got_tags == sorted(expected), f"dashboards' reader: {plugin} tags {got_tags}"):
            continue
        for tag in got_tags:
            check(pacc.SummaryMetadata(tag).data_class == data_class, f"dashboards' reader: {tag!r} data class")
    for tag, points in want["scalars"].items():
        if tag in pacc.Tags()["tensors"]:
            got = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)), e.wall_time) for e in pacc.Tensors(tag)]
            exp = [(s, f32(v), t) for s, v, t in points]
            check(untimed(got, exp) == exp, f"dashboards' reader: scalars {tag!r}: got {got}, expected {exp}")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # reported with what was found before it
        problems.append(f"{type(e).__name__}: {e}")
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        sys.exit(1)
    print("tensorboard_check: OK")
