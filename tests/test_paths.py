"""How rlfleet reads and writes files: through symlinks, with the umask's modes, no temp file left
behind, a size cap applied while reading, duplicate keys and every validation error reported.

(Every file argument given every kind of path mistake is in tests/test_fuzz.py.)
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fuzz_cli import check, run
from fuzz_edges import BASE_CLUSTER, BASE_PLAN, BASE_WORKLOADS, to_text

from traces import Plan, SpecError
from traces.io import atomic_write_text, load_yaml, read_user_bytes
from traces.os_errors import os_error_line


@pytest.fixture
def files(tmp_path: Path) -> list[str]:
    """--cluster/--workload/--plan arguments for a small valid job (simulates in well under a second)."""
    args = []
    for flag, name, doc in (("--cluster", "c.yaml", BASE_CLUSTER), ("--workload", "w.yaml", BASE_WORKLOADS[0]),
                            ("--plan", "p.json", BASE_PLAN)):
        (tmp_path / name).write_text(to_text(doc, as_json=name.endswith(".json")))
        args += [flag, str(tmp_path / name)]
    return args


def _simulate(capsys: pytest.CaptureFixture[str], files: list[str], *extra: str) -> tuple[int, str, str]:
    argv = ["simulate", *files, "--steps", "1", *extra]
    code, out, err = run(capsys, argv)
    check(code, out, err, argv)
    return code, out, err


def test_an_output_symlink_is_written_through(tmp_path: Path, files: list[str],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """--timeline naming a link to a file: the file gets the CSV and keeps its mode; the link stays."""
    real, link = tmp_path / "real.csv", tmp_path / "link.csv"
    real.write_text("old\n")
    real.chmod(0o640)
    link.symlink_to(real.name)
    assert _simulate(capsys, files, "--timeline", str(link))[0] == 0
    assert link.is_symlink() and real.read_text().startswith("resource,")
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize(("umask", "file_mode", "folder_mode"), [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_new_files_and_folders_follow_the_umask(tmp_path: Path, files: list[str], capsys: pytest.CaptureFixture[str],
                                                umask: int, file_mode: int, folder_mode: int) -> None:
    """As open() and mkdir would: 0666 / 0777 less the umask (not the temp file's 0600)."""
    old = os.umask(umask)
    try:
        assert _simulate(capsys, files, "--timeline", str(tmp_path / "new" / "t.csv"))[0] == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new" / "t.csv").stat().st_mode) == file_mode
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == folder_mode


WRITER = """
import sys
from traces.io import atomic_write_bytes
print("ready", flush=True)
while True:  # rewrite a large file until stopped: the signal lands mid-write
    atomic_write_bytes(sys.argv[1], b"new" * (1 << 26))
"""


@contextlib.contextmanager
def _writer(target: Path, ignore_hup: bool = False) -> Iterator[subprocess.Popen[bytes]]:
    """The WRITER, started with SIGTERM and SIGHUP at their defaults (or SIGHUP ignored, as under
    nohup), whatever this process inherited: an ignored signal stays ignored across exec. Killed on
    the way out: a writer that outlived its signal would rewrite 200 MB until the suite ends."""
    def dispositions() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_IGN if ignore_hup else signal.SIG_DFL)

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    with subprocess.Popen([sys.executable, "-c", WRITER, str(target)], stdout=subprocess.PIPE, env=env,
                          preexec_fn=dispositions) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
            yield proc
        finally:
            proc.kill()


def test_sigterm_mid_write_leaves_no_temp_file(tmp_path: Path) -> None:
    """SIGTERM (and SIGHUP) while writing: the temp file is removed and the old or new file is in place."""
    target = tmp_path / "plan.json"
    codes = []
    for sig, delay in ((signal.SIGTERM, 0.3), (signal.SIGTERM, 0.6), (signal.SIGHUP, 0.4)):
        target.write_bytes(b"old")
        with _writer(target) as proc:
            time.sleep(delay)
            proc.send_signal(sig)
            codes.append(proc.wait(timeout=60))
        assert target.read_bytes() in (b"old", b"new" * (1 << 26))
        assert not list(tmp_path.glob(".plan.json.*.tmp"))
    assert 128 + signal.SIGTERM in codes  # at least one signal landed mid-write (exit via SystemExit)


def test_a_writer_under_nohup_keeps_writing_through_sighup(tmp_path: Path) -> None:
    """An ignored SIGHUP (nohup) is left ignored, as the user asked: the writer goes on; SIGTERM still
    stops it cleanly."""
    target = tmp_path / "plan.json"
    with _writer(target, ignore_hup=True) as proc:
        time.sleep(0.3)
        proc.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) in (128 + signal.SIGTERM, -signal.SIGTERM)
    assert not list(tmp_path.glob(".plan.json.*.tmp"))


def test_a_killed_writers_temp_file_is_swept_by_the_next_write(tmp_path: Path) -> None:
    """SIGKILL leaves a temp file: the next write of the same target removes it if its writer is
    gone and it is old, and leaves a live writer's or a fresh one alone."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = int(dead.stdout)
    stale = tmp_path / f".plan.json.{gone}.abc123.tmp"
    fresh = tmp_path / f".plan.json.{gone}.def456.tmp"
    live = tmp_path / f".plan.json.{os.getpid()}.ghi789.tmp"
    for f in (stale, fresh, live):
        f.write_text("partial")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    os.utime(live, (old, old))
    atomic_write_text(tmp_path / "plan.json", "{}")
    assert not stale.exists() and fresh.exists() and live.exists()


def test_a_huge_sparse_file_is_refused_before_reading(tmp_path: Path) -> None:
    """A 2 GB (sparse) file: refused by its size, in a process that stays far below 2 GB."""
    big = tmp_path / "big.yaml"
    with big.open("wb") as handle:
        handle.truncate(2 * 1024**3)
    # VmHWM, the peak RSS of this process's own memory (ru_maxrss carries over the forking pytest's, ~1.3 GB)
    script = ("import re, sys; from planner.cli import main; code = main(sys.argv[1:]); "
              "print(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)); sys.exit(code)")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    proc = subprocess.run([sys.executable, "-c", script, "validate", "--cluster", str(big)], capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 2 and "larger than 4 MiB" in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert int(proc.stdout) * 1024 < 1024**3  # VmHWM is in kB


def test_read_cap_counts_bytes_actually_read(tmp_path: Path) -> None:
    """A file that says it is small but is not (like /proc files, size 0) is still capped."""
    path = tmp_path / "f.yaml"
    path.write_bytes(b"a" * 101)
    assert read_user_bytes(path, cap=101) == b"a" * 101
    with pytest.raises(SpecError, match="larger than"):
        read_user_bytes(path, cap=100)
    assert len(read_user_bytes("/proc/self/status", cap=1 << 20)) > 0  # size 0 on disk, read in full


def test_duplicate_keys_name_the_key_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("name: a\nnode_groups:\n  - {gpu_type: H100, nodes: 1}\nname: b\n")
    with pytest.raises(SpecError, match=r"c\.yaml:4: duplicate key 'name' \(keep one\)$"):
        load_yaml(path)
    with pytest.raises(SpecError, match=r"plan\.json: duplicate key 'tp'"):
        Plan.from_json('{"rollout": [{"gpu_type": "H20", "tp": 1, "tp": 2, "instances": 1}], '
                       '"trainer": {"gpu_type": "H100"}}', "plan.json")
    path.write_text("base: &b {gpu_type: H100, nodes: 1}\nnode_groups:\n  - {<<: *b, nodes: 2}\n")
    assert load_yaml(path)["node_groups"][0]["nodes"] == 2  # a merge key's value may be overridden


def test_every_validation_error_is_listed_with_the_nested_fields(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("node_groups:\n  - {gpu_type: H100, nodes: 0, lable: x}\n"
                    "  - {gpu_type: H20, nodes: 1, inter_node_gb_per_s: 1.0e-300}\n")
    argv = ["validate", "--cluster", str(path)]
    code, out, err = run(capsys, argv)
    check(code, out, err, argv)
    assert code == 2
    assert "'node_groups.0.nodes'" in err and "'node_groups.1.inter_node_gb_per_s'" in err
    assert "unknown field 'node_groups.0.lable'; remove it (did you mean label?)" in err
    assert "known: gpu_type, gpus_per_node, inter_node_gb_per_s, label, nodes, price_per_gpu_hour" in err
    assert "at least 1 item" not in err  # pydantic's echo of the items' errors is dropped
    path.write_text("node_groups:\n" + "".join(f"  - {{gpu_type: H100, nodes: {-i}}}\n" for i in range(8)))
    code, out, err = run(capsys, argv)
    assert code == 2 and err.count("node_groups.") == 5 and err.rstrip().endswith("and 3 more")


def test_absurd_model_numbers_are_refused_naming_the_field(tmp_path: Path) -> None:
    """bytes_per_param 1e-300 made a simulation run past 700 s; now it is one line."""
    from traces.workload import load_workload

    path = tmp_path / "w.yaml"
    model = {**BASE_WORKLOADS[0]["model"], "bytes_per_param": 1e-300}
    path.write_text(to_text({**BASE_WORKLOADS[0], "model": model}, as_json=False))
    with pytest.raises(SpecError, match=r"'model\.bytes_per_param': Input should be greater than or equal to 0\.125"):
        load_workload(path)


def test_histogram_counts_near_the_float_limits(tmp_path: Path) -> None:
    from traces.workload import load_workload

    path, hist = tmp_path / "w.yaml", tmp_path / "h.csv"
    path.write_text(to_text({**BASE_WORKLOADS[0], "response_len": {"kind": "empirical", "file": "h.csv"}}, False))
    hist.write_text("length,count\n10,1e308\n20,1e308\n")  # each finite, the sum is not
    with pytest.raises(SpecError, match="counts sum to more than a float holds"):
        load_workload(path)
    hist.write_text("length,count\n10,1e-320\n20,3e-320\n")  # subnormal: few bits of precision left
    dist = load_workload(path).response_len
    assert dist.expected() == pytest.approx(17.5, abs=0.01)
    assert abs(dist.probabilities().sum() - 1) < 1e-12


@pytest.mark.parametrize("seed", ["-1", str(2**63), "1.5", "x"])
def test_seed_must_be_a_non_negative_whole_number(files: list[str], capsys: pytest.CaptureFixture[str],
                                                  seed: str) -> None:
    code, _, err = _simulate(capsys, files, "--seed", seed)
    assert code == 2 and "--seed" in err


def test_the_largest_seed_runs_and_repeats(files: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    first = _simulate(capsys, files, "--seed", str(2**63 - 1), "--json")
    assert first[0] == 0 and _simulate(capsys, files, "--seed", str(2**63 - 1), "--json") == first


def test_os_errors_read_as_path_what_fix(tmp_path: Path) -> None:
    """Real OSErrors (not built by hand) in the CLI's one-line form."""
    (tmp_path / "f").write_text("x")
    (tmp_path / "loop").symlink_to("loop")
    cases = {tmp_path / "missing": "no such file or folder (check the path)",
             tmp_path: "is a folder (give a file path)",
             tmp_path / "f" / "x": "a part of the path is a file, not a folder (fix the path)",
             tmp_path / "loop": "a symbolic link loop, or too many links in a row (fix the link)"}
    for path, expected in cases.items():
        with pytest.raises(OSError) as caught:
            path.open("rb").close()
        assert os_error_line(caught.value) == f"{path}: {expected}"
    assert caught.value.errno == errno.ELOOP
