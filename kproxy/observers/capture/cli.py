"""``kproxy capture show`` and ``kproxy capture stats``: read a JSONL or Parquet capture.

::

    kproxy capture show  DIR_OR_FILE [--api Produce,Fetch] [--client-id 'billing-*'] [--topic orders]
                                     [--conn 12] [--errors] [--limit 50] [--verbose]
    kproxy capture stats DIR_OR_FILE [--top 10]

A directory means every capture file in it of one format, oldest first:
JSONL if there is any (it has the bodies ``--verbose`` prints), else
Parquet. ``.jsonl.gz`` files are read too. Files of every schema version
are read (a column a file does not have is absent from its rows).

Wiring: ``add_arguments(subparsers)`` registers the ``capture`` command and
sets ``func`` on the parsed arguments; ``kproxy/cli.py`` then runs
``args.func(args)``.
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import gzip
import json
import math
import os
import sys
from collections import Counter, defaultdict
from typing import Any, Iterable, Iterator, TextIO

from .summary import MAX_TOPIC_IDS, iso_utc


# ---------------------------------------------------------------- reading

class NotACapture(ValueError):
    """The input is no kproxy capture (a missing path, no capture files, rows that are not
    capture rows); the message names the file and, in JSONL, the line."""


# Every capture row carries this column (every schema version); Parquet files carry it too.
VERSION_COLUMN = "capture_version"


def capture_files(path: str, fmt: str | None = None) -> list[str]:
    """The files ``path`` names: itself, or a directory's capture files of one format."""
    if os.path.isfile(path):
        if path.endswith(".pcapng"):
            raise NotACapture(f"{path}: pcapng is for Wireshark or tshark; show and stats read the "
                              f"capture's JSONL or Parquet files")
        return [path]
    if not os.path.isdir(path):
        raise NotACapture(f"no such capture file or directory: {path}")
    jsonl = sorted(glob.glob(os.path.join(path, "*.jsonl")) + glob.glob(os.path.join(path, "*.jsonl.gz")))
    parquet = sorted(glob.glob(os.path.join(path, "*.parquet")))
    found = parquet if fmt == "parquet" or (fmt is None and not jsonl) else jsonl
    if not found:
        wanted = {"parquet": "*.parquet", "jsonl": "*.jsonl, *.jsonl.gz"}.get(
            fmt, "*.jsonl, *.jsonl.gz, *.parquet")
        raise NotACapture(f"{path}: no capture files ({wanted}) in this directory")
    return found


def _jsonl_row(name: str, number: int, line: str) -> dict:
    try:
        row = json.loads(line)
    except ValueError:
        raise NotACapture(f"{name}, line {number}: not a kproxy capture (not JSON)") from None
    if not isinstance(row, dict) or VERSION_COLUMN not in row:
        raise NotACapture(f"{name}, line {number}: not a kproxy capture row (no {VERSION_COLUMN})")
    return row


def _parquet_file(name: str):
    import pyarrow
    import pyarrow.parquet as pq
    try:
        f = pq.ParquetFile(name)
    except (pyarrow.ArrowException, OSError) as exc:
        raise NotACapture(f"{name}: not a kproxy capture (not a Parquet file: {exc})") from None
    if VERSION_COLUMN not in f.schema_arrow.names:
        raise NotACapture(f"{name}: not a kproxy capture (a Parquet file without {VERSION_COLUMN})")
    return f


_TIMESTAMP_COLUMNS = ("time", "connection_start")


def read_rows(path: str, fmt: str | None = None) -> Iterator[dict]:
    """Rows of a capture, whatever the format; timestamps as ISO strings in both."""
    for name in capture_files(path, fmt):
        if name.endswith(".parquet"):
            for batch in _parquet_file(name).iter_batches(batch_size=10_000):
                for row in batch.to_pylist():
                    for column in _TIMESTAMP_COLUMNS:
                        t = row.get(column)
                        if t is not None:
                            row[column] = iso_utc(t.timestamp())
                    yield row
        else:
            opener = gzip.open if name.endswith(".gz") else open
            try:
                with opener(name, "rt", encoding="utf-8") as f:
                    for number, line in enumerate(f, 1):
                        if line.strip():
                            yield _jsonl_row(name, number, line)
            except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as exc:
                raise NotACapture(f"{name}: not a kproxy capture ({exc})") from None


# ---------------------------------------------------------------- show

def _matches(row: dict, apis, client_id, topic, connection, errors_only) -> bool:
    if apis and row.get("api_name", "").lower() not in apis:
        return False
    if client_id is not None and not fnmatch.fnmatchcase(row.get("client_id") or "", client_id):
        return False
    if topic is not None and not any(fnmatch.fnmatchcase(t, topic) for t in row.get("topics") or ()):
        return False
    if connection is not None and row.get("connection_id") != connection:
        return False
    if errors_only and not row.get("error_count"):
        return False
    return True


def format_row(row: dict) -> str:
    latency = row.get("latency_ms")
    lat = f"{latency:9.2f}ms" if latency is not None else f"{row.get('outcome', '-'):>11}"
    resp = row.get("response_size")
    parts = [
        row.get("time", "?"),
        f"conn={row.get('connection_id', '?'):<5}",
        f"{row.get('client_host', '?')}:{row.get('client_port', '?'):<6}",
        f"{row.get('api_name', '?'):<20} v{row.get('api_version', '?'):<2}",
        f"corr={row.get('correlation_id', '?'):<7}",
        lat,
        f"req={row.get('request_size', 0):>8}B",
        f"resp={resp:>8}B" if resp is not None else "resp=       -",
        f"client={row.get('client_id') or '-'}",
    ]
    if row.get("group_id") is not None:
        parts.append(f"group={row['group_id']}")
    if row.get("topics"):
        topics = row["topics"]
        parts.append("topics=" + ",".join(topics[:5]) + (f",+{len(topics) - 5}" if len(topics) > 5 else ""))
    if row.get("record_count") is not None:
        parts.append(f"records={row['record_count']}")
    if row.get("errors"):
        parts.append("errors=" + ",".join(row["errors"]))
    if row.get("decode_error"):
        parts.append("UNDECODED")
    return " ".join(str(p) for p in parts)


def show(path: str, *, apis: Iterable[str] = (), client_id: str | None = None, topic: str | None = None,
         connection: int | None = None, errors_only: bool = False, limit: int | None = None,
         verbose: bool = False, fmt: str | None = None, out: TextIO | None = None) -> int:
    """Print one line per pair (and with ``verbose`` the JSONL bodies); returns the lines printed."""
    out = out or sys.stdout
    wanted = {a.strip().lower() for a in apis if a.strip()}
    shown = 0
    for row in read_rows(path, fmt):
        if not _matches(row, wanted, client_id, topic, connection, errors_only):
            continue
        if limit is not None and shown >= limit:
            break
        print(format_row(row), file=out)
        if verbose:
            for side in ("request", "response"):
                if side in row:
                    body = json.dumps(row[side], indent=2, sort_keys=False)
                    print(f"  {side}: " + body.replace("\n", "\n  "), file=out)
        shown += 1
    return shown


# ---------------------------------------------------------------- stats

def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an unsorted list (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(round(q * len(ordered), 9)))      # round: 0.99 * 100 is 99.00000000000001
    return ordered[min(rank, len(ordered)) - 1]


def compute_stats(rows: Iterable[dict], top: int = 10) -> dict[str, Any]:
    apis: dict[str, dict[str, Any]] = defaultdict(lambda: {"pairs": 0, "latencies": [], "request_bytes": 0,
                                                           "response_bytes": 0, "errors": 0})
    errors: Counter = Counter()
    clients: Counter = Counter()
    topics: Counter = Counter()
    outcomes: Counter = Counter()
    connections = set()                 # (proxy_instance, connection_id): ids are per kproxy process
    # connection -> (time, (client_software_name, client_software_version)) of its latest row
    # naming software: each row carries its connection's software as of that pair, so the
    # latest is the connection's (client_software.software_named: Kafka's rule).
    software: dict[tuple, tuple] = {}
    connection_clients: dict[tuple, set] = defaultdict(set)
    has_software = False                # schema version 2+ rows seen
    writers: dict[tuple, list] = defaultdict(lambda: [0, 0])   # (topic, principal) -> [pairs, records]
    has_principal = False               # schema version 3+ rows seen
    id_names: dict[str, str] = {}       # topic id -> name, from every row's topic_ids
    first = last = None
    total = request_bytes = response_bytes = 0
    for row in rows:
        total += 1
        api = apis[row.get("api_name", "?")]
        api["pairs"] += 1
        if row.get("latency_ms") is not None:
            api["latencies"].append(row["latency_ms"])
        api["request_bytes"] += row.get("request_size") or 0
        api["response_bytes"] += row.get("response_size") or 0
        api["errors"] += row.get("error_count") or 0
        request_bytes += row.get("request_size") or 0
        response_bytes += row.get("response_size") or 0
        for name in row.get("errors") or ():
            errors[name] += 1
        clients[row.get("client_id") or "-"] += 1
        for t in row.get("topics") or ():
            topics[t] += 1
        for pair in row.get("topic_ids") or ():
            if len(id_names) < MAX_TOPIC_IDS:
                id_names[pair["topic_id"]] = pair["topic"]
        outcomes[row.get("outcome", "?")] += 1
        connection = (row.get("proxy_instance"), row.get("connection_id"))
        connections.add(connection)
        if "client_software_name" in row:
            has_software = True
            name, version = row["client_software_name"], row.get("client_software_version")
            if name or version:
                t, latest = row.get("time"), software.get(connection)
                if latest is None or t is None or latest[0] is None or t >= latest[0]:
                    software[connection] = (t, (name, version))
        if row.get("client_id"):
            connection_clients[connection].add(row["client_id"])
        if "principal" in row:
            has_principal = True
            if row.get("api_name") == "Produce":
                _count_writers(writers, row)
        t = row.get("time")
        if t is not None:
            first = t if first is None or t < first else first
            last = t if last is None or t > last else last
    if id_names:        # rows of a proxy that knew only the id count under the name others gave
        topics = Counter(_named(topics, id_names))
        writers = _named(writers, id_names, lambda key, name: (name, key[1]), _add_pairs)
    per_api = {}
    for name, api in sorted(apis.items(), key=lambda kv: -kv[1]["pairs"]):
        lat = api.pop("latencies")
        per_api[name] = dict(api, p50_ms=percentile(lat, 0.5), p99_ms=percentile(lat, 0.99),
                             max_ms=max(lat) if lat else None)
    return {"pairs": total, "connections": len(connections), "first": first, "last": last,
            "request_bytes": request_bytes, "response_bytes": response_bytes, "apis": per_api,
            "errors": dict(errors.most_common()), "outcomes": dict(outcomes.most_common()),
            "top_clients": clients.most_common(top), "top_topics": topics.most_common(top),
            "client_software": (_software_inventory(connections, {c: named for c, (_, named) in software.items()},
                                                    connection_clients)
                                if has_software else None),
            "topic_writers": ([{"topic": topic, "principal": principal, "pairs": n, "records": records}
                               for (topic, principal), (n, records) in sorted(
                                   writers.items(), key=lambda kv: (-kv[1][1], -kv[1][0], kv[0][0], kv[0][1] or ""))]
                              if has_principal else None)}


def _named(counts: dict, id_names: dict[str, str], rename=lambda key, name: name,
           add=lambda a, b: a + b) -> dict:
    """``counts`` with keys naming a topic id (the key itself, or its topic per ``rename``)
    moved to its name, merged with ``add``."""
    out: dict = {}
    for key, value in counts.items():
        topic = key[0] if isinstance(key, tuple) else key
        if topic in id_names:
            key = rename(key, id_names[topic])
        out[key] = add(out[key], value) if key in out else value
    return out


def _add_pairs(a: list, b: list) -> list:
    return [a[0] + b[0], a[1] + b[1]]


def _count_writers(writers: dict, row: dict) -> None:
    """Who writes to which topic: Produce pairs and records per (topic, principal)."""
    principal = row.get("principal")
    per_topic = {entry["topic"]: entry["record_count"] or 0 for entry in row.get("topic_records") or ()}
    for topic in row.get("topics") or ():
        entry = writers[(topic, principal)]
        entry[0] += 1
        entry[1] += per_topic.get(topic, 0)


def _software_inventory(connections, software, connection_clients) -> list[dict[str, Any]]:
    """Connections and client_ids per client software (name, version), most connections first."""
    inventory: dict[tuple, dict[str, Any]] = {}
    for connection in connections:
        name, version = software.get(connection, (None, None))
        entry = inventory.setdefault((name, version), {"name": name, "version": version, "connections": 0,
                                                       "client_ids": set()})
        entry["connections"] += 1
        entry["client_ids"] |= connection_clients.get(connection, set())
    out = sorted(inventory.values(), key=lambda e: (-e["connections"], e["name"] or "", e["version"] or ""))
    for entry in out:
        entry["client_ids"] = sorted(entry["client_ids"])
    return out


_LISTED_CLIENT_IDS = 5      # per software line; the rest are counted


def _ms(value: float | None) -> str:
    return f"{value:10.2f}" if value is not None else f"{'-':>10}"


def stats(path: str, *, top: int = 10, fmt: str | None = None, out: TextIO | None = None) -> dict[str, Any]:
    """Summarise a capture; prints a report and returns the numbers."""
    out = out or sys.stdout
    s = compute_stats(read_rows(path, fmt), top)
    print(f"{s['pairs']} pairs on {s['connections']} connections, {s['first'] or '-'} .. {s['last'] or '-'}; "
          f"requests {s['request_bytes']} B, responses {s['response_bytes']} B", file=out)
    print(f"{'API':<24}{'pairs':>8}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}"
          f"{'req bytes':>14}{'resp bytes':>14}{'errors':>8}", file=out)
    for name, api in s["apis"].items():
        print(f"{name:<24}{api['pairs']:>8}{_ms(api['p50_ms'])}{_ms(api['p99_ms'])}{_ms(api['max_ms'])}"
              f"{api['request_bytes']:>14}{api['response_bytes']:>14}{api['errors']:>8}", file=out)
    print("outcomes: " + ", ".join(f"{k} {v}" for k, v in s["outcomes"].items()), file=out)
    if s["errors"]:
        print("errors by name:", file=out)
        for name, count in s["errors"].items():
            print(f"  {name:<40}{count:>8}", file=out)
    print("top clients (client_id):", file=out)
    for name, count in s["top_clients"]:
        print(f"  {name:<40}{count:>8}", file=out)
    if s["top_topics"]:
        print("top topics:", file=out)
        for name, count in s["top_topics"]:
            print(f"  {name:<40}{count:>8}", file=out)
    if s["client_software"]:
        print("client software (ApiVersions v3+):", file=out)
        print(f"  {'name':<28}{'version':<24}{'connections':>12}  client_ids", file=out)
        for entry in s["client_software"][:top]:
            ids = entry["client_ids"]
            listed = ", ".join(ids[:_LISTED_CLIENT_IDS]) + (f", +{len(ids) - _LISTED_CLIENT_IDS}"
                                                            if len(ids) > _LISTED_CLIENT_IDS else "")
            print(f"  {entry['name'] or '(unknown)':<28}{entry['version'] or '-':<24}"
                  f"{entry['connections']:>12}  {listed or '-'}", file=out)
    if s["topic_writers"]:
        print("who writes to each topic (Produce, by principal):", file=out)
        print(f"  {'topic':<32}{'principal':<32}{'requests':>10}{'records':>10}", file=out)
        for entry in s["topic_writers"][:top]:
            print(f"  {entry['topic']:<32}{entry['principal'] or '(anonymous)':<32}"
                  f"{entry['pairs']:>10}{entry['records']:>10}", file=out)
    return s


# ---------------------------------------------------------------- argparse

def add_arguments(subparsers) -> argparse.ArgumentParser:
    """Register ``capture show`` and ``capture stats`` on a parent's subparsers."""
    capture = subparsers.add_parser("capture", help="read JSONL / Parquet traffic captures",
                                    description="Read the JSONL or Parquet files kproxy's capture "
                                                "writes: a file, or a directory of them.")
    # No command: kproxy/cli.py shows this parser's help (main below does the same).
    sub = capture.add_subparsers(dest="capture_command", title="commands", metavar="COMMAND")
    show_p = sub.add_parser("show", help="one line per request/response pair")
    show_p.add_argument("path", help="a capture file or a capture directory")
    show_p.add_argument("--api", default="", help="API names, comma-separated (e.g. Produce,Fetch)")
    show_p.add_argument("--client-id", help="client_id glob, e.g. 'billing-*'")
    show_p.add_argument("--topic", help="topic name or glob")
    show_p.add_argument("--conn", type=int, help="connection id")
    show_p.add_argument("--errors", action="store_true", help="only pairs with an error code")
    show_p.add_argument("--limit", type=int, help="stop after this many lines")
    show_p.add_argument("--verbose", "-v", action="store_true", help="print decoded bodies (JSONL)")
    show_p.add_argument("--format", choices=("jsonl", "parquet"), help="which files of a directory")
    show_p.set_defaults(func=_run_show, command_parser=show_p)
    stats_p = sub.add_parser("stats", help="pairs, latency p50/p99, bytes and errors per API; "
                                             "client software inventory")
    stats_p.add_argument("path", help="a capture file or a capture directory")
    stats_p.add_argument("--top", type=int, default=10, help="how many clients / topics / software to list")
    stats_p.add_argument("--format", choices=("jsonl", "parquet"), help="which files of a directory")
    stats_p.set_defaults(func=_run_stats, command_parser=stats_p)
    return capture


# Exit statuses, as every kproxy command has them (kproxy/cli.py).
INPUT_ERROR = 2
RUNTIME_ERROR = 1


def _guarded(command: str, work) -> int:
    """Run ``work``; an error becomes one line, ``kproxy capture <command>: error: ...``."""
    try:
        work()
    except BrokenPipeError:          # `| head`
        return 0
    except (NotACapture, PermissionError, IsADirectoryError) as exc:
        status, message = INPUT_ERROR, str(exc)
    except OSError as exc:           # the disk failing under us, not the input
        status, message = RUNTIME_ERROR, str(exc)
    except ValueError as exc:        # a Parquet file that is damaged inside
        status, message = INPUT_ERROR, f"not a readable kproxy capture: {exc}"
    else:
        return 0
    print(f"kproxy capture {command}: error: {message}", file=sys.stderr)
    return status


def _run_show(args) -> int:
    return _guarded("show", lambda: show(
        args.path, apis=args.api.split(","), client_id=args.client_id, topic=args.topic,
        connection=args.conn, errors_only=args.errors, limit=args.limit, verbose=args.verbose,
        fmt=args.format))


def _run_stats(args) -> int:
    return _guarded("stats", lambda: stats(args.path, top=args.top, fmt=args.format))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kproxy")
    capture = add_arguments(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        capture.print_help(sys.stderr)
        return INPUT_ERROR
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
