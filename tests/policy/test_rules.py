"""The rules file and its checks, without a broker.

Each check judges a request the same whether it reads the decoded body (live) or the
JSON capture wrote of it (``kproxy analyze``); a bad file names the file, rule and key.
"""

from __future__ import annotations

import json

import pytest

from kproxy import config as kconfig
from kproxy.observers.capture.redact import to_json
from kproxy.policy import PolicyError, Subject, load_policy
from kproxy.policy.checks import version_number
from kproxy.policy.rules import parse_policy
from kproxy.protocol import API_KEYS, Request, Response, Struct, decode_response, encode_request, encode_response, new_body
from kproxy.protocol.records import CODEC_NAMES
from kproxy.protocol.connection import Connection
from kproxy.proxy.local_requests import ClientSplit, LocalRequest
from kproxy.proxy.policy_answers import PolicyAnswers
from tests.protocol.frames import framed

pytestmark = pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning")

PRODUCE, FETCH, CREATE, JOIN = (API_KEYS[n] for n in ("Produce", "Fetch", "CreateTopics", "JoinGroup"))


def _policy(**rules):
    return parse_policy({"rules": rules}, "test.toml")


def _batch(compression: str, producer_id: int) -> bytes:
    """A magic 2 batch of one record (kafka-python's encoder)."""
    from kafka.record.default_records import DefaultRecordBatchBuilder
    codec = CODEC_NAMES.index(compression)
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False,
                                        producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                                        base_sequence=0 if producer_id >= 0 else -1, batch_size=1 << 20)
    builder.append(0, timestamp=None, key=b"k", value=b"v" * 200, headers=[])
    return bytes(builder.build())


def _both(api_key: int, version: int, body, client_id="svc-a", software=(None, None)):
    """The Subject of a request as kproxy reads it live, and as analyze reads its capture JSON."""
    live = Subject(api_key, version, client_id, software, body)
    captured = Subject(api_key, version, client_id, software, json.loads(json.dumps(to_json(body))))
    return live, captured


def _judged(policy, subjects) -> list[list[str]]:
    return [sorted(f"{v.rule.name}: {v.reason}" for v in policy.violations(s)) for s in subjects]


def _produce(acks: int, compression: str = "zstd", producer_id: int = 7):
    return new_body("request", PRODUCE, 9, acks=acks, topic_data=[Struct(name="t", partition_data=[
        Struct(index=0, records=_batch(compression, producer_id))])])


@pytest.mark.parametrize("acks,compression,expected", [
    (-1, "zstd", []),
    (1, "zstd", ["acks: acks=1"]),
    (-1, "none", ["zip: uncompressed batches"]),
    (0, "gzip", ["acks: acks=0", "zip: compressed with gzip"]),
])
def test_produce_checks_judge_live_and_captured_bodies_alike(acks, compression, expected):
    policy = _policy(acks={"check": "acks_all"}, zip={"check": "compressed", "codecs": ["zstd", "lz4"]})
    assert _judged(policy, _both(PRODUCE, 9, _produce(acks, compression))) == [expected, expected]


def test_idempotence_is_read_from_the_batches_live_only():
    policy = _policy(idem={"check": "idempotent"})
    live, captured = _both(PRODUCE, 9, _produce(-1, producer_id=-1))
    assert _judged(policy, [live]) == [["idem: batches without a producer id"]]
    assert _judged(policy, [captured]) == [[]]           # capture keeps no producer ids
    assert _judged(policy, [Subject(PRODUCE, 9, "c", body=_produce(-1, producer_id=42))]) == [[]]


def test_create_topics_names_replication_partitions_and_configs():
    policy = _policy(names={"check": "topic_names", "pattern": "^team-"},
                     settings={"check": "create_topics", "min_replication_factor": 3, "max_partitions": 12,
                               "configs": {"retention.ms": {"max": 604800000}}})

    def create(name, replication, partitions=6, retention="86400000"):
        topic = Struct(name=name, num_partitions=partitions, replication_factor=replication, assignments=[],
                       configs=[Struct(name="retention.ms", value=retention)])
        return new_body("request", CREATE, 7, topics=[topic])

    cases = [(create("team-a", 3), []),
             (create("misc", 3), ["names: topic name 'misc' does not match"]),
             (create("team-a", 1), ["settings: topic 'team-a': replication factor 1 below 3"]),
             (create("team-a", -1), ["settings: topic 'team-a': replication factor left to the broker's default"]),
             (create("team-a", 3, partitions=50), ["settings: topic 'team-a': 50 partitions, above 12"]),
             (create("team-a", 3, retention="999999999999"),
              ["settings: topic 'team-a': retention.ms=999999999999 above 6.048e+08"])]
    for body, expected in cases:
        assert _judged(policy, _both(CREATE, 7, body)) == [expected, expected]


def test_fetch_bounds_client_ids_groups_software_and_removed_versions():
    policy = _policy(fetch={"check": "fetch_bounds", "max_wait_ms": {"max": 1000}, "max_bytes": {"min": 1024}},
                     named={"check": "client_id", "pattern": "^svc-"},
                     groups={"check": "group_names", "pattern": "^app-"},
                     software={"check": "client_software", "min_versions": {"apache-kafka-java": "3.5"}},
                     kip896={"check": "removed_api_versions"})
    fetch = new_body("request", FETCH, 12, max_wait_ms=5000, max_bytes=52428800)
    assert _judged(policy, _both(FETCH, 12, fetch)) == [["fetch: max_wait_ms=5000 above 1000"]] * 2
    join = new_body("request", JOIN, 9, group_id="billing")
    assert _judged(policy, _both(JOIN, 9, join, client_id=None, software=("apache-kafka-java", "3.4.1"))) == [
        ["groups: group 'billing' does not match", "named: no client id",
         "software: apache-kafka-java 3.4.1 older than 3.5"]] * 2
    assert _judged(policy, [Subject(PRODUCE, 2, "svc-x")]) == [["kip896: Produce v2 (removed in Kafka 4.0)"]]
    assert version_number("2.16.1-rdkafka-2.16.0") == (2, 16, 1) and version_number("dev") is None


@pytest.mark.parametrize("text,message", [
    ('[rules.a]\ncheck = "nope"\n', "rules.a.check: expected one of"),
    ('[rules.a]\ncheck = "client_id"\npatern = "x"\n', "rules.a.patern: unknown key for check 'client_id'"),
    ('[rules.a]\ncheck = "topic_names"\n', "rules.a.pattern: required"),
    ('[rules.a]\ncheck = "topic_names"\npattern = "(a)\\\\1"\n', "rules.a.pattern:"),
    ('[rules.a]\ncheck = "acks_all"\nenforce = "yes"\n', "rules.a.enforce: expected true or false"),
    ('[rules.a]\ncheck = "fetch_bounds"\nmax_bytes = 5\n', "rules.a.max_bytes: expected a table"),
    ('[rules.a]\ncheck = "client_software"\nmin_versions = {x = "new"}\n', "rules.a.min_versions.x:"),
    ('[rules.a]\ncheck = "acks_all"\nerror = "OOPS"\n', "rules.a.error: expected a Kafka error name"),
    ('[rule.a]\ncheck = "acks_all"\n', "rule: unknown key"),
    ("[rules]\n", "rules: expected a table of named rules"),
])
def test_a_bad_rules_file_names_file_rule_and_key(tmp_path, text, message):
    path = tmp_path / "policy.toml"
    path.write_text(text)
    with pytest.raises(PolicyError, match=f"^policy file {path}: ") as caught:
        load_policy(path)
    assert message in str(caught.value)
    with pytest.raises(kconfig.ConfigError, match="policy file"):          # and at kproxy's start
        kconfig.build({"upstream": "b:1", "policy_file": str(path)})


def test_a_yaml_rules_file_reads_like_toml(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text("rules:\n  acks:\n    check: acks_all\n    enforce: true\n")
    config = kconfig.build({"upstream": "b:1", "policy_file": str(path)})
    assert [(r.name, r.enforce, r.error) for r in config.policy.rules] == [("acks", True, "INVALID_REQUIRED_ACKS")]
    assert config.policy.enforcing


def _split(conn: Connection, split: ClientSplit, chunks) -> list:
    """The relay's client path: each read framed by the tracker, then split; runs of bytes
    to forward joined, local requests kept."""
    parts: list = []
    for chunk in chunks:
        for piece in split.split(chunk, conn.receive_client(chunk)):
            if piece.__class__ is LocalRequest:
                parts.append(piece)
            elif parts and isinstance(parts[-1], bytes):
                parts[-1] += bytes(piece)
            else:
                parts.append(bytes(piece))
    return parts


def test_enforced_rules_refuse_in_order_and_answer_in_the_request_version():
    policy = _policy(acks={"check": "acks_all", "enforce": True})
    counts: dict[str, int] = {}
    conn, split = Connection(), ClientSplit([PolicyAnswers(policy, counts)])
    metadata = framed(encode_request(Request(3, 12, 1, "svc", new_body("request", 3, 12, topics=[]))))
    bad = framed(encode_request(Request(PRODUCE, 9, 2, "svc", _produce(1))))
    good = framed(encode_request(Request(PRODUCE, 9, 3, "svc", _produce(-1))))
    data = metadata + bad + good
    parts = _split(conn, split, (data[:10], data[10:]))        # cut mid-frame
    assert [p if isinstance(p, bytes) else "refused" for p in parts] == [metadata, "refused", good]
    refusal = parts[1]
    assert refusal.event.correlation_id == 2 and counts == {"acks": 1}
    # Its turn comes once the Metadata request (sent before it) is answered.
    assert conn.oldest_unanswered() is not refusal.event
    conn.receive_broker(framed(encode_response(Response(1, new_body("response", 3, 12)), 3, 12)))
    assert conn.oldest_unanswered() is refusal.event
    answer = decode_response(refusal.by.answer(None, refusal.event), PRODUCE, 9)
    assert answer.correlation_id == 2
    assert [p.error_code for t in answer.body.responses for p in t.partition_responses] == [21]


def test_a_request_too_large_to_keep_whole_is_judged_on_the_bytes_held_back():
    """The tracker keeps only the header of a frame past ``stream_frame_bytes``; the split
    held every byte of it back, and judges (and refuses) it whole all the same."""
    policy = _policy(acks={"check": "acks_all", "enforce": True})
    counts: dict[str, int] = {}
    conn = Connection(stream_frame_bytes=256)
    split = ClientSplit([PolicyAnswers(policy, counts)])
    bad = framed(encode_request(Request(PRODUCE, 9, 1, "svc", _produce(1, "none"))))
    good = framed(encode_request(Request(PRODUCE, 9, 2, "svc", _produce(-1, "none"))))
    assert len(bad) > 256
    parts = _split(conn, split, [(bad + good)[i:i + 100] for i in range(0, len(bad + good), 100)])
    assert [p if isinstance(p, bytes) else "refused" for p in parts] == ["refused", good]
    assert parts[0].event.streamed and counts == {"acks": 1}
    answer = decode_response(parts[0].by.answer(None, parts[0].event), PRODUCE, 9)
    assert [p.error_code for t in answer.body.responses for p in t.partition_responses] == [21]


def test_capture_rows_are_judged_with_or_without_bodies():
    """``kproxy analyze``: a JSONL row's request body, or a Parquet row's columns alone."""
    from kproxy.pipeline.policy import judge_rows, judged_without_bodies
    policy = _policy(acks={"check": "acks_all"}, zip={"check": "compressed"},
                     named={"check": "client_id", "pattern": "^svc-"})
    row = {"time": None, "client_host": "10.0.0.1", "client_port": 5000, "client_id": "app",
           "api_key": PRODUCE, "api_name": "Produce", "api_version": 9, "client_software_name": "librdkafka",
           "client_software_version": "2.16.0", "compression": ["none"]}
    body = json.dumps(to_json(_produce(1, "none")))
    found = [(rule, client, software, reason) for rule, client, software, _, _, _, _, reason
             in judge_rows(policy, [{**row, "request": body}, row])]
    assert found == [("acks", "app", "librdkafka 2.16.0", "acks=1"),
                     ("zip", "app", "librdkafka 2.16.0", "uncompressed batches"),
                     ("named", "app", "librdkafka 2.16.0", "client id 'app' does not match"),
                     # Parquet: no body (acks unknown), compression from its column
                     ("zip", "app", "librdkafka 2.16.0", "uncompressed batches"),
                     ("named", "app", "librdkafka 2.16.0", "client id 'app' does not match")]
    assert judged_without_bodies(policy) == ["acks"]
