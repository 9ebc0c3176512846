"""The audit trail against a real SASL/SCRAM broker, driven by Kafka's own command-line tools.

Each tool (kafka-topics, kafka-configs, kafka-acls, kafka-consumer-groups) runs through
kproxy as the SCRAM user ``alice``; the audit file, the ``kproxy.audit`` log and
``kproxy_audit_events_total`` must hold exactly the changes the tools made, in order,
with the resources, settings and the broker's answers, and neither password anywhere.
A consumer group member's own commits (and produce/fetch traffic) are not audited.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import uuid

import pytest

from kproxy.embedded.kafka import run_tool
from tests.observers.metrics import sample, scrape_until
from tests.observers.test_principal_live import spellings
from tests.proxy.harness import PASSWORD, SCRAM_USER, ProxyThread, sasl_config

pytestmark = pytest.mark.broker

CONFIG_COMMAND = "kafka.admin.ConfigCommand"
ACL_COMMAND = "org.apache.kafka.tools.AclCommand"
NEW_USER, NEW_PASSWORD = "bob", "bob-very-secret-2718"
JAAS_PASSWORD = "jaas-very-secret-3141"
ROTATE_BYTES = 4096          # the smallest allowed: these few events rotate the file
TOOL_TIMEOUT_S = 120


def audit_files(directory) -> list[str]:
    """Oldest first: audit.jsonl.N ... audit.jsonl.1, audit.jsonl."""
    rotated = sorted(glob.glob(os.path.join(directory, "audit.jsonl.*")),
                     key=lambda p: -int(p.rsplit(".", 1)[1]))
    return rotated + [os.path.join(directory, "audit.jsonl")]


class TestAuditTrail:
    def test_kafka_tools_changes_are_audited_with_principal_and_answers(self, sasl_cluster, tmp_path, caplog):
        from confluent_kafka import Consumer, Producer
        from kafka import KafkaAdminClient
        from kafka.admin import NewTopic

        caplog.set_level(logging.INFO, logger="kproxy.audit")
        audit_dir = tmp_path / "audit"
        topic, group = f"audit-{uuid.uuid4().hex[:8]}", f"audit-group-{uuid.uuid4().hex[:8]}"
        second = f"{topic}-second"
        properties = tmp_path / "client.properties"
        properties.write_text(
            "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\n"
            "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{SCRAM_USER}" password="{PASSWORD}";\n')
        with ProxyThread(upstream=sasl_cluster.bootstrap_servers, instance_name="kproxy-audit-test",
                         audit={"path": str(audit_dir / "audit.jsonl"), "rotate_bytes": ROTATE_BYTES,
                                "keep": 20}) as proxy:
            def tool(main_class, *args, check=True):
                return run_tool(sasl_cluster, main_class, "--bootstrap-server", proxy.bootstrap,
                                "--command-config", str(properties), *args, check=check,
                                timeout=TOOL_TIMEOUT_S)

            tools = sasl_cluster.tools
            tool(tools.topics, "--create", "--topic", topic, "--partitions", "2",
                 "--replication-factor", "1", "--config", "retention.ms=3600000")
            tool(CONFIG_COMMAND, "--alter", "--entity-type", "topics", "--entity-name", topic,
                 "--add-config", "cleanup.policy=compact")
            # A secret in a config value (a broker's JAAS login): the value never reaches the audit.
            tool(CONFIG_COMMAND, "--alter", "--entity-type", "brokers", "--entity-default", "--add-config",
                 "listener.name.client.plain.sasl.jaas.config=[org.apache.kafka.common.security.plain."
                 f'PlainLoginModule required user_{NEW_USER}="{JAAS_PASSWORD}";]', check=False)
            tool(CONFIG_COMMAND, "--alter", "--entity-type", "users", "--entity-name", NEW_USER,
                 "--add-config", f"SCRAM-SHA-512=[iterations=8192,password={NEW_PASSWORD}]")
            tool(ACL_COMMAND, "--add", "--allow-principal", f"User:{NEW_USER}", "--operation", "Read",
                 "--topic", topic)
            again = tool(tools.topics, "--create", "--topic", topic, "--partitions", "1", check=False)
            assert again.returncode != 0         # it exists: the broker refuses
            # Another client (kafka-python): two topics at once, one of which exists.
            admin = KafkaAdminClient(bootstrap_servers=proxy.bootstrap, client_id="audit-kafka-python",
                                     security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512",
                                     sasl_plain_username=SCRAM_USER, sasl_plain_password=PASSWORD)
            try:
                admin.create_topics([NewTopic(topic, 1, 1), NewTopic(second, 1, 1)], raise_errors=False)
                admin.delete_topics([second])
            finally:
                admin.close()

            # A group member's own commit: not an audit event.
            client = sasl_config(proxy, "SCRAM-SHA-512")
            producer = Producer({**client, "linger.ms": 0})
            delivered = []
            producer.produce(topic, b"v", key=b"k", partition=0,      # compacted: records need keys
                             on_delivery=lambda err, msg: delivered.append(err))
            assert producer.flush(30) == 0 and delivered == [None]
            del producer
            consumer = Consumer({**client, "group.id": group, "auto.offset.reset": "earliest",
                                 "enable.auto.commit": False})
            consumer.subscribe([topic])
            message = None
            for _ in range(60):
                message = consumer.poll(1.0)
                if message is not None and message.error() is None:
                    break
            assert message is not None and message.error() is None
            consumer.commit(message, asynchronous=False)
            consumer.close()
            del consumer

            tool(tools.consumer_groups, "--group", group, "--topic", topic, "--reset-offsets",
                 "--to-earliest", "--execute")
            tool(ACL_COMMAND, "--remove", "--force", "--allow-principal", f"User:{NEW_USER}",
                 "--operation", "Read", "--topic", topic)
            tool(tools.topics, "--delete", "--topic", topic)

            expected = [("CreateTopics", "ok"), ("IncrementalAlterConfigs", "ok"), ("IncrementalAlterConfigs", "error"),
                        ("AlterUserScramCredentials", "ok"), ("CreateAcls", "ok"),
                        ("CreateTopics", "error"), ("CreateTopics", "partial"), ("DeleteTopics", "ok"),
                        ("OffsetCommit", "ok"), ("DeleteAcls", "ok"), ("DeleteTopics", "ok")]
            m = scrape_until(lambda m: sample(m, "kproxy_audit_events_total", api="DeleteTopics",
                                              outcome="ok") >= 1, "the DeleteTopics audit event", proxy)
            for api, outcome in set(expected):
                assert sample(m, "kproxy_audit_events_total", api=api, outcome=outcome) == \
                    expected.count((api, outcome)), (api, outcome)
            assert sample(m, "kproxy_audit_events_dropped_total") == 0
        # The proxy has stopped: the writer has drained and closed the file.

        files = audit_files(str(audit_dir))
        blobs = [open(path, "rb").read() for path in files]
        events = [json.loads(line) for blob in blobs for line in blob.splitlines()]
        assert [(e["api"], e["outcome"]) for e in events] == expected
        assert sum(map(len, blobs)) > ROTATE_BYTES and len(files) >= 2       # it rotated
        assert all(len(blob) <= ROTATE_BYTES for blob in blobs)
        assert oct(os.stat(files[-1]).st_mode & 0o777) == "0o600"

        # The log carries the same events, one INFO line each.
        logged = [json.loads(r.getMessage()) for r in caplog.records
                  if r.name == "kproxy.audit" and r.levelno == logging.INFO]
        assert logged == events

        for e in events:
            assert e["principal"] == SCRAM_USER
            assert e["proxy_instance"] == "kproxy-audit-test"
            assert e["client_address"].startswith("127.0.0.1:")
            assert e["latency_ms"] >= 0
        create, alter, jaas, scram, acl, exists, both, python_delete, reset, unacl, delete = events
        for e in (create, alter, jaas, scram, acl, exists, reset, unacl, delete):
            assert e["client_id"].startswith("adminclient-")
            assert e["client_software_name"] == "apache-kafka-java" and e["client_software_version"]
        assert both["client_id"] == python_delete["client_id"] == "audit-kafka-python"

        (asked,) = create["request"]["topics"]
        assert (asked["name"], asked["num_partitions"], asked["replication_factor"]) == (topic, 2, 1)
        assert asked["configs"] == [{"name": "retention.ms", "value": "3600000"}]
        assert [(r["name"], r["error"]) for r in create["results"]] == [(topic, "NONE")]

        (resource,) = alter["request"]["resources"]
        assert (resource["resource_type"], resource["resource_name"]) == ("TOPIC", topic)
        assert resource["configs"] == [{"name": "cleanup.policy", "config_operation": "SET", "value": "compact"}]
        assert [(r["resource_type"], r["resource_name"], r["error"]) for r in alter["results"]] == \
            [("TOPIC", topic, "NONE")]

        (resource,) = jaas["request"]["resources"]
        assert (resource["resource_type"], resource["resource_name"]) == ("BROKER", "")
        (secret,) = resource["configs"]
        assert secret["name"] == "listener.name.client.plain.sasl.jaas.config"
        assert secret["value"].startswith("<redacted ")
        (refused,) = jaas["results"]                 # a listener's JAAS login is set per broker only
        assert refused["error"] == "INVALID_REQUEST" and "broker id must be specified" in refused["message"]

        (upsert,) = scram["request"]["upsertions"]
        assert (upsert["name"], upsert["mechanism"], upsert["iterations"]) == (NEW_USER, "SCRAM-SHA-512", 8192)
        assert upsert["salted_password"].startswith("<redacted ") and upsert["salt"].startswith("<redacted ")
        assert scram["request"]["deletions"] == []
        assert [(r["user"], r["error"]) for r in scram["results"]] == [(NEW_USER, "NONE")]

        (creation,) = acl["request"]["creations"]
        assert (creation["resource_type"], creation["resource_name"], creation["principal"],
                creation["operation"], creation["permission_type"]) == \
            ("TOPIC", topic, f"User:{NEW_USER}", "READ", "ALLOW")
        (created,) = acl["results"]
        assert created["error"] == "NONE" and created["request"] == creation

        assert [t["name"] for t in exists["request"]["topics"]] == [topic]
        (refused,) = exists["results"]
        assert (refused["name"], refused["error"]) == (topic, "TOPIC_ALREADY_EXISTS")
        assert topic in refused["message"]

        assert sorted((r["name"], r["error"]) for r in both["results"]) == \
            sorted([(topic, "TOPIC_ALREADY_EXISTS"), (second, "NONE")])
        assert [(r["name"], r["error"]) for r in python_delete["results"]] == [(second, "NONE")]

        (removal,) = unacl["request"]["filters"]
        assert (removal["resource_type_filter"], removal["resource_name_filter"], removal["principal_filter"],
                removal["operation"]) == ("TOPIC", topic, f"User:{NEW_USER}", "READ")
        assert [(r["error"], r.get("resource_name"), r.get("principal")) for r in unacl["results"]] == \
            [("NONE", None, None), ("NONE", topic, f"User:{NEW_USER}")]   # the filter, the ACL it removed

        assert reset["request"]["group_id"] == group
        assert (reset["request"]["generation_id_or_member_epoch"], reset["request"]["member_id"]) == (-1, "")
        (committed,) = reset["request"]["topics"]
        assert committed["name"] == topic
        assert sorted((p["partition_index"], p["committed_offset"]) for p in committed["partitions"]) == \
            [(0, 0), (1, 0)]
        assert sorted((r["name"], r["partition_index"], r["error"]) for r in reset["results"]) == \
            [(topic, 0, "NONE"), (topic, 1, "NONE")]

        assert [t["name"] for t in delete["request"].get("topics") or []] + \
            (delete["request"].get("topic_names") or []) == [topic]
        assert [(r["name"], r["error"]) for r in delete["results"]] == [(topic, "NONE")]

        # No password: neither the user's the tools logged in with nor the one they set.
        log_text = "\n".join(r.getMessage() for r in caplog.records).encode()
        for where, blob in (("audit files", b"".join(blobs)), ("log", log_text)):
            for secret in (PASSWORD, NEW_PASSWORD, JAAS_PASSWORD):
                for leak in spellings(secret.encode()):
                    assert leak not in blob, f"a password ({leak!r}) is in the {where}"
