"""The class archive of a Kafka jar directory: recorded once by a JVM that exits by itself,
mapped by every later one, keyed by the java binary and the jars."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from kproxy.embedded.class_archive import KAFKA_ARCHIVES_ENV, ClassArchive


@pytest.fixture
def jars(tmp_path):
    directory = tmp_path / "kafka" / "lib"
    directory.mkdir(parents=True)
    (directory / "a.jar").write_bytes(b"a" * 10)
    return directory


@pytest.fixture
def java(tmp_path):
    path = tmp_path / "java"
    path.write_bytes(b"#!/bin/sh\n")
    return str(path)


def test_recorded_once_then_mapped(java, jars):
    first = ClassArchive.for_jars(java, jars)
    assert first.recording is not None and not first.path.exists()
    assert f"-XX:ArchiveClassesAtExit={first.recording}" in first.jvm_args()
    first.recording.write_bytes(b"archive")              # what the JVM writes as it exits
    first.finish(0)
    assert first.path.read_bytes() == b"archive" and not first.recording.exists()
    second = ClassArchive.for_jars(java, jars)
    assert second == ClassArchive(first.path)
    assert f"-XX:SharedArchiveFile={first.path}" in second.jvm_args()


def test_a_jvm_killed_while_recording_leaves_nothing(java, jars):
    archive = ClassArchive.for_jars(java, jars)
    archive.recording.write_bytes(b"half")
    archive.finish(-9)
    assert not archive.recording.exists() and not archive.path.exists()


def test_other_jars_or_another_java_get_their_own(java, jars, tmp_path):
    first = ClassArchive.for_jars(java, jars)
    (jars / "b.jar").write_bytes(b"b")
    assert ClassArchive.for_jars(java, jars).path != first.path
    other_java = tmp_path / "java2"
    other_java.write_bytes(b"#!/bin/sh\nexit 0\n")
    assert ClassArchive.for_jars(str(other_java), jars).path != ClassArchive.for_jars(java, jars).path


def test_brokers_map_but_never_record_and_it_can_be_switched_off(java, jars, monkeypatch):
    assert ClassArchive.for_jars(java, jars, record=False) is None
    monkeypatch.setenv(KAFKA_ARCHIVES_ENV, "0")
    assert ClassArchive.for_jars(java, jars) is None


@pytest.mark.skipif(shutil.which("java") is None, reason="needs java")
def test_the_jvm_maps_what_it_recorded(tmp_path):
    """A real JVM records an archive of its classes and a second one starts with it mapped."""
    java = shutil.which("java")
    jars = tmp_path / "lib"
    jars.mkdir()
    archive = ClassArchive.for_jars(java, jars)
    run = subprocess.run([java, *archive.jvm_args(), "-version"], capture_output=True, timeout=120)
    archive.finish(run.returncode)
    assert run.returncode == 0 and archive.path.stat().st_size > 0
    mapped = ClassArchive.for_jars(java, jars)
    shown = subprocess.run([java, f"-XX:SharedArchiveFile={mapped.path}", "-Xshare:on", "-version"],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr                      # -Xshare:on fails if it cannot map
    assert os.path.samefile(mapped.path, archive.path)
