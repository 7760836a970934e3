"""scripts/prereqs.txt is the one list of Debian prerequisites, and scripts/prereqs installs from it
only what is missing (issue 30). The script runs here against fake dpkg-query, apt-get, dpkg and
id on PATH: the real ones would change this machine."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tiers import PREREQS, apt_fix, debian_prereqs, group_fix, parse_prereqs

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "prereqs"
# copies checked to be subsets of the list instead: the operator's command, Debian's Build-Depends
SUBSET_COPIES = {"docs/OPERATIONS.md", "packaging/debian/control"}


def names_on(line: str, packages: list[str]) -> set[str]:
    return {p for p in packages if re.search(rf"(?<![\w.-]){re.escape(p)}(?![\w.-])", line)}


def test_the_list_parses_into_known_groups_without_duplicates() -> None:
    lines = [ln.split("#", 1)[0].split() for ln in PREREQS.read_text().splitlines()]
    entries = [fields[0] for fields in lines if fields]
    assert len(entries) == len(set(entries)) == len(debian_prereqs())
    assert set(debian_prereqs().values()) == {"venv", "build", "tiers"}
    assert parse_prereqs("a venv  # why\n# b tiers\n\nc build\n") == {"a": "venv", "c": "build"}


def test_scripts_test_bootstrap_and_ci_reach_the_list_only_through_scripts_prereqs() -> None:
    assert "prereqs.txt" in SCRIPT.read_text()
    test, bootstrap, ci = ((REPO / p).read_text() for p in ("scripts/test", "scripts/bootstrap", ".ci/run"))
    assert re.search(r"^\s*scripts/prereqs( |$)", test, re.M)
    assert re.search(r"scripts/prereqs --group venv", bootstrap)
    # CI runs the README's test command, which installs the list; it keeps no apt step of its own
    assert "\nscripts/test     #" in (REPO / "README.md").read_text()
    assert re.search(r"^scripts/test$", ci, re.M)
    for name, text in (("scripts/test", test), ("scripts/bootstrap", bootstrap), (".ci/run", ci)):
        code = "\n".join(ln.split("#", 1)[0] for ln in text.splitlines())
        other_python = name == "scripts/bootstrap" and "python3.X-venv" in code
        assert "apt-get install" not in code or other_python, name
        assert not names_on(code, list(debian_prereqs())), f"{name} names a package of the list"


def test_no_other_file_keeps_a_copy_of_the_list() -> None:
    packages = list(debian_prereqs())
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    copies = []
    for name in files:
        path = REPO / name
        if name == "scripts/prereqs.txt" or name.startswith("tests/fixtures/") or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            found = names_on(line, packages)
            if len(found) >= 2 and name not in SUBSET_COPIES:
                copies.append(f"{name}:{n}: {sorted(found)}")
    assert not copies, "hand-kept copies of scripts/prereqs.txt (use scripts/prereqs or tiers.apt_fix):\n" \
        + "\n".join(copies)


def test_the_operator_guide_and_build_depends_name_only_listed_packages() -> None:
    packages = set(debian_prereqs())
    guide = next(ln for ln in (REPO / "docs/OPERATIONS.md").read_text().splitlines()
                 if ln.startswith("sudo apt-get install dpkg-dev"))
    assert set(guide.split()[3:]) <= packages
    control = (REPO / "packaging/debian/control").read_text()
    build = re.search(r"^Build-Depends: (.*)$", control, re.M)
    assert build is not None
    # the -compat virtual package is debhelper's; python3 is pulled in by the venv package
    names = {re.sub(r"\s*\(.*\)", "", d).strip().replace("debhelper-compat", "debhelper")
             for d in build.group(1).split(",")} - {"python3"}
    assert names <= packages, names - packages


def test_a_fix_may_only_name_a_listed_package() -> None:
    assert apt_fix("prometheus").endswith("--no-install-recommends prometheus")
    with pytest.raises(ValueError, match="not in"):
        apt_fix("not-a-listed-package")
    assert group_fix("venv").endswith("--no-install-recommends python3-venv")


# ---- scripts/prereqs against fakes

FAKES = {
    "dpkg-query": 'for p; do :; done; grep -qx "$p" "$FAKE_DB" || exit 1; printf "install ok installed"',
    "apt-get": """echo "apt-get $*" >>"$FAKE_LOG"
if [ -n "${FAKE_LOCKED_ONCE:-}" ] && [ ! -e "$FAKE_LOCKED_ONCE" ]; then
    : >"$FAKE_LOCKED_ONCE"; echo "E: Could not get lock /var/lib/apt/lists/lock" >&2; exit 100
fi
seen=0
for a; do
    case $a in install) seen=1 ;; -*|*=*) ;; *) [ $seen = 1 ] && echo "$a" >>"$FAKE_DB" ;; esac
done
exit 0""",
    "dpkg": '[ "$1" = --audit ] && exit 0; echo "dpkg $*" >>"$FAKE_LOG"',
    "id": 'echo "$FAKE_UID"',
}


def run_prereqs(tmp_path: Path, *args: str, installed: list[str], uid: int = 0,
                **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    for name, body in FAKES.items():
        (fake / name).write_text("#!/bin/sh\n" + body + "\n")
        (fake / name).chmod(0o755)
    db, log = tmp_path / "db", tmp_path / "log"
    if not db.exists():
        db.write_text("".join(p + "\n" for p in installed))
    log.write_text("")
    (tmp_path / "dpkg" / "updates").mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, check=False, timeout=60,
        env={"PATH": f"{fake}:/usr/bin:/bin", "FAKE_DB": str(db), "FAKE_LOG": str(log),
             "FAKE_UID": str(uid), "DPKG_ADMINDIR": str(tmp_path / "dpkg"), **env},
    )
    return proc, log.read_text().splitlines()


def test_nothing_missing_calls_no_apt_get(tmp_path: Path) -> None:
    proc, calls = run_prereqs(tmp_path, installed=list(debian_prereqs()))
    assert proc.returncode == 0, proc.stderr
    assert calls == []


def test_as_root_it_updates_then_installs_only_the_missing_and_a_second_run_does_nothing(
        tmp_path: Path) -> None:
    packages = list(debian_prereqs())
    proc, calls = run_prereqs(tmp_path, installed=packages[1:])
    assert proc.returncode == 0, proc.stderr
    assert calls[0] == "apt-get update -qq"
    assert calls[1].startswith("apt-get install -y")
    assert calls[1].endswith(f"--no-install-recommends {packages[0]}")
    assert len(calls) == 2
    proc, calls = run_prereqs(tmp_path, installed=[])  # the fake db kept the install
    assert proc.returncode == 0 and calls == []


def test_without_root_it_prints_the_one_command_and_installs_nothing(tmp_path: Path) -> None:
    packages = list(debian_prereqs())
    proc, calls = run_prereqs(tmp_path, installed=packages[2:], uid=1000)
    assert proc.returncode == 0
    assert calls == []
    assert f"sudo apt-get install --no-install-recommends {packages[0]} {packages[1]}\n" in proc.stderr
    strict, _ = run_prereqs(tmp_path, "--strict", installed=[], uid=1000)
    assert strict.returncode == 1
    printed, calls = run_prereqs(tmp_path, "--print", installed=[], uid=0)
    assert calls == [] and "sudo apt-get install" in printed.stderr


def test_an_interrupted_dpkg_is_settled_before_apt_get_but_not_by_print(tmp_path: Path) -> None:
    (tmp_path / "dpkg" / "updates").mkdir(parents=True)
    (tmp_path / "dpkg" / "updates" / "0001").write_text("")
    printed, calls = run_prereqs(tmp_path, "--print", installed=list(debian_prereqs()))
    assert printed.returncode == 0 and calls == []
    (tmp_path / "db").unlink()
    proc, calls = run_prereqs(tmp_path, installed=list(debian_prereqs())[1:])
    assert proc.returncode == 0, proc.stderr
    assert calls[0].startswith("dpkg --configure -a")
    assert calls[1] == "apt-get update -qq"


def test_a_held_lock_is_waited_out(tmp_path: Path) -> None:
    proc, calls = run_prereqs(tmp_path, installed=list(debian_prereqs())[1:],
                              FAKE_LOCKED_ONCE=str(tmp_path / "locked"))
    assert proc.returncode == 0, proc.stderr
    assert calls[:2] == ["apt-get update -qq", "apt-get update -qq"]
    assert "waiting for another package manager" in proc.stderr
    assert any(c.startswith("apt-get install") for c in calls)


def test_a_group_installs_only_its_packages(tmp_path: Path) -> None:
    venv = [p for p, g in debian_prereqs().items() if g == "venv"]
    proc, calls = run_prereqs(tmp_path, "--group", "venv", "--strict", installed=[])
    assert proc.returncode == 0, proc.stderr
    assert calls[-1].endswith("--no-install-recommends " + " ".join(venv))
    bad, _ = run_prereqs(tmp_path, "--group", "nosuch", installed=[])
    assert bad.returncode == 2 and "no package of group 'nosuch'" in bad.stderr


def test_the_script_is_executable_posix_sh() -> None:
    # scripts/test and scripts/bootstrap run it directly on a bare Debian (dash as /bin/sh)
    assert os.access(SCRIPT, os.X_OK)
    assert SCRIPT.read_text().startswith("#!/bin/sh\n")
