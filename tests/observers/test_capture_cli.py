"""``kproxy capture show`` / ``stats`` on captures written by the Capture observer."""

from __future__ import annotations

import argparse
import gzip
import io
import shutil

import pytest

from kproxy.observers.capture import Capture, CaptureConfig
from kproxy.observers.capture import cli
from tests.observers.captures import Link, files, produce_request, produce_response


@pytest.fixture(scope="module")
def capture_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("capture")
    capture = Capture()
    capture.start(CaptureConfig(directory=str(directory), formats=("jsonl", "parquet")))
    a = Link(capture, conn_id=1, client=("10.0.0.1", 5000))
    b = Link(capture, conn_id=2, client=("10.0.0.2", 5001))
    for corr in range(1, 11):
        a.exchange(0, 9, corr, produce_request("orders"), produce_response("orders", error=6 if corr == 3 else 0),
                   client_id="billing")
    b.exchange(18, 3, 1, client_id="reports")
    b.exchange(0, 9, 2, produce_request("audit"), produce_response("audit"), client_id="reports")
    b.request(1, 12, 3, topics=[], client_id="reports")
    b.close(capture)
    capture.stop()
    return directory


def test_show_prints_one_line_per_pair_with_filters(capture_dir):
    out = io.StringIO()
    assert cli.show(str(capture_dir), out=out) == 13
    lines = out.getvalue().splitlines()
    assert "conn=1" in lines[0] and "Produce" in lines[0] and "corr=1 " in lines[0]
    assert "client=billing" in lines[0] and "topics=orders" in lines[0] and "records=3" in lines[0]
    assert any("unanswered" in line and "Fetch" in line for line in lines)
    out = io.StringIO()
    assert cli.show(str(capture_dir), errors_only=True, out=out) == 1
    assert "errors=NOT_LEADER_OR_FOLLOWER" in out.getvalue() and "corr=3 " in out.getvalue()
    assert cli.show(str(capture_dir), apis=["apiversions", "Fetch"], out=io.StringIO()) == 2
    assert cli.show(str(capture_dir), client_id="rep*", out=io.StringIO()) == 3
    assert cli.show(str(capture_dir), topic="aud*", out=io.StringIO()) == 1
    assert cli.show(str(capture_dir), connection=1, limit=4, out=io.StringIO()) == 4
    out = io.StringIO()
    cli.show(str(capture_dir), apis=["ApiVersions"], verbose=True, out=out)
    assert "  request: {" in out.getvalue() and '"api_keys"' in out.getvalue()


def test_show_reads_parquet_and_gzipped_jsonl(capture_dir, tmp_path):
    jsonl_lines, parquet_lines = io.StringIO(), io.StringIO()
    cli.show(str(capture_dir), out=jsonl_lines)
    cli.show(str(capture_dir), fmt="parquet", out=parquet_lines)
    assert parquet_lines.getvalue() == jsonl_lines.getvalue()
    source = files(capture_dir, "jsonl")[0]
    with open(source, "rb") as f, gzip.open(tmp_path / "c.jsonl.gz", "wb") as g:
        shutil.copyfileobj(f, g)
    assert cli.show(str(tmp_path), out=io.StringIO()) == 13


def test_stats(capture_dir):
    out = io.StringIO()
    s = cli.stats(str(capture_dir), out=out)
    assert s["pairs"] == 13 and s["connections"] == 2
    produce = s["apis"]["Produce"]
    assert produce["pairs"] == 11 and produce["errors"] == 1
    assert produce["p50_ms"] is not None and produce["p99_ms"] >= produce["p50_ms"]
    assert s["errors"] == {"NOT_LEADER_OR_FOLLOWER": 1}
    assert s["outcomes"] == {"response": 12, "unanswered": 1}
    assert s["top_clients"][0] == ("billing", 10)
    assert s["top_topics"] == [("orders", 10), ("audit", 1)]
    text = out.getvalue()
    assert "p50 ms" in text and "NOT_LEADER_OR_FOLLOWER" in text and "billing" in text
    assert cli.stats(str(capture_dir), fmt="parquet", out=io.StringIO()) == s


def test_percentile_is_nearest_rank():
    values = list(range(1, 101))
    assert cli.percentile(values, 0.5) == 50 and cli.percentile(values, 0.99) == 99
    assert cli.percentile([7.0], 0.99) == 7.0 and cli.percentile([], 0.5) is None


def test_add_arguments_registers_capture_show_and_stats(capture_dir, capsys):
    parser = argparse.ArgumentParser(prog="kproxy")
    sub = parser.add_subparsers(dest="command", required=True)
    cli.add_arguments(sub)
    args = parser.parse_args(["capture", "show", str(capture_dir), "--api", "Produce", "--limit", "2"])
    assert args.func(args) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    args = parser.parse_args(["capture", "stats", str(capture_dir)])
    assert args.func(args) == 0 and "Produce" in capsys.readouterr().out
    assert cli.main(["capture", "show", str(capture_dir / "missing")]) == 2
    assert "no such capture" in capsys.readouterr().err


def test_stats_count_a_topic_named_by_id_under_the_name_another_row_gave():
    """Merged captures of two sidecars: one relayed the Metadata answer (id and name), the
    other only Fetches and Produces by id. ``stats`` counts one topic, under its name."""
    topic_id, unnamed = "hx3ONFVgRtqmrInl_2Nq4w", "AAECAwQFBgcICQoLDA0ODw"
    rows = [
        {"api_name": "Metadata", "proxy_instance": "a", "connection_id": 1, "topics": ["orders"],
         "principal": None, "topic_ids": [{"topic_id": topic_id, "topic": "orders"}]},
        {"api_name": "Produce", "proxy_instance": "a", "connection_id": 2, "topics": ["orders"],
         "principal": "alice", "topic_records": [{"topic": "orders", "record_count": 3}], "topic_ids": None},
        {"api_name": "Produce", "proxy_instance": "b", "connection_id": 1, "topics": [topic_id],
         "principal": "alice", "topic_records": [{"topic": topic_id, "record_count": 2}], "topic_ids": None},
        {"api_name": "Fetch", "proxy_instance": "b", "connection_id": 2, "topics": [unnamed],
         "principal": None, "topic_ids": None},
    ]
    s = cli.compute_stats(rows)
    assert dict(s["top_topics"]) == {"orders": 3, unnamed: 1}
    assert s["topic_writers"] == [{"topic": "orders", "principal": "alice", "pairs": 2, "records": 5}]
