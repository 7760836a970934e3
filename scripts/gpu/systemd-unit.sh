#!/usr/bin/env bash
# The shipped unit, hardening unchanged, under a real systemd on the GPU machine (issue 16, item 2).
#
# The device has no systemd (Ubuntu 24.04 userland, Firecracker kernel, cgroup2, root). Debian 12's
# systemd 252 (carried as .deb in .sd/, see /work/shared/tools/systemd-on-gpu) is unpacked into
# /tmp/sd and booted as PID 1 of new pid/mount/cgroup/uts/ipc namespaces. The supervisor's unit is
# rendered by the shipped `units/sglang-model add` from the shipped template; ONE drop-in adapts
# only what this machine forces: where Python, the supervisor and SGLang live (ExecStart,
# PYTHONPATH), the offline flags of the pruned SGLang install, and root-less ownership of the
# copied files. Every hardening line stays as shipped.
#
# Expects scripts/gpu-e2e's set-up (the overlay in /tmp/site, wheels in /tmp/pylib, the seed model
# in $MODEL). PrivateTmp=yes hides /tmp from the unit, so those are copied under /opt/sgs first.
# Writes $OUT/systemd.txt (everything measured) and returns 0 when every check passed.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/gpu-e2e-out}
MODEL=${MODEL:-/tmp/tiny36}
CONFIG=${CONFIG:?a supervisor config (YAML) for the unit}
WAIT_S=${WAIT_S:-360}
py=${GPU_E2E_PYTHON:-/opt/torch/.venv/bin/python3}
rep=$OUT/systemd.txt
: > "$rep"
say() { echo "$*" | tee -a "$rep" >&2; }
fails=0
ok() { if [ "$1" = 0 ]; then say "PASS $2"; else say "FAIL $2"; fails=$((fails + 1)); fi; }
t0=$(date +%s.%N)
el() { python3 -c "import time;print(round(time.time()-$t0,1))"; }

# --- payload outside /tmp --------------------------------------------------------------------
mkdir -p /opt/sgs
cp -a /tmp/site /opt/sgs/site; cp -a /tmp/pylib /opt/sgs/pylib; cp -a "$root/daemon" /opt/sgs/daemon
cp -a "$MODEL" /opt/sgs/model
id sglang >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin sglang
# The kernel caches are the supervisor's to place (CacheDirectory/engine-cache/KEY, issue 26): no
# copy of /tmp/jit, so this first start under the unit is a cold one, as on a fresh host.
mkdir -p /var/cache/sglang-supervisor
chown -R sglang:sglang /var/cache/sglang-supervisor
chmod -R a+rX /opt/sgs
mkdir -p /etc/sglang-supervisor
sed "s#$MODEL#/opt/sgs/model#g" "$CONFIG" > /etc/sglang-supervisor/seed.yaml
chmod 0644 /etc/sglang-supervisor/seed.yaml
say "payload ready at $(el) s; engine venv marker: $(ls $(dirname $(dirname $py))/pyvenv.cfg 2>&1)"

# --- systemd 252 from Debian 12 ----------------------------------------------------------------
mkdir -p /tmp/sd && for f in "$root"/.sd/*.deb; do dpkg -x "$f" /tmp/sd; done
SD=/tmp/sd
printf '%s\n' $SD/lib/x86_64-linux-gnu $SD/usr/lib/x86_64-linux-gnu $SD/usr/lib/x86_64-linux-gnu/systemd \
  $SD/lib/x86_64-linux-gnu/systemd > /tmp/sd.conf
cat /etc/ld.so.conf /tmp/sd.conf > /tmp/ld.all.conf
ldconfig -C /tmp/ld.so.cache -f /tmp/ld.all.conf 2>/dev/null
baseline=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
say "GPU memory used before: $baseline MiB"

unshare --pid --fork --mount --cgroup --uts --ipc bash -c '
mount --make-rprivate /
# This pid namespace'"'"'s own /proc: systemd and journald read /proc/PID of the processes they manage
# (with the host'"'"'s /proc, journald attributed no line to the unit and "Main PID" named a kworker).
mount -t proc proc /proc
mount -t tmpfs tmpfs /run
mkdir -p /run/systemd/system /usr/lib/systemd
mount --bind /tmp/sd/lib/systemd /usr/lib/systemd
umount -R /sys/fs/cgroup 2>/dev/null; mount -t cgroup2 cgroup2 /sys/fs/cgroup || echo cgroup-mount-failed
mount --bind /tmp/ld.so.cache /etc/ld.so.cache
for u in systemd-tmpfiles-setup.service systemd-tmpfiles-setup-dev.service systemd-udevd.service \
  systemd-udev-trigger.service systemd-modules-load.service systemd-sysctl.service systemd-remount-fs.service \
  systemd-journal-flush.service systemd-update-utmp.service systemd-random-seed.service systemd-sysusers.service \
  systemd-firstboot.service getty.target console-getty.service systemd-logind.service sys-kernel-debug.mount \
  sys-kernel-tracing.mount sys-kernel-config.mount dev-hugepages.mount dev-mqueue.mount systemd-binfmt.service \
  proc-sys-fs-binfmt_misc.automount systemd-hwdb-update.service ldconfig.service \
  systemd-journal-catalog-update.service systemd-machine-id-commit.service systemd-update-done.service \
  systemd-pstore.service sys-fs-fuse-connections.mount; do ln -sf /dev/null /run/systemd/system/$u; done
[ -s /etc/machine-id ] || { cat /proc/sys/kernel/random/uuid | tr -d - > /run/machine-id; mount --bind /run/machine-id /etc/machine-id; }
exec /tmp/sd/lib/systemd/systemd --system --unit=multi-user.target --log-target=console --log-level=info
' > /tmp/sdboot.log 2>&1 &
P=
for _ in $(seq 1 60); do
  P=$(pgrep -f "^/tmp/sd/lib/systemd/systemd --system" | head -1)
  [ -n "$P" ] && nsenter -t "$P" -a /tmp/sd/bin/systemctl is-system-running 2>/dev/null | grep -qE "running|degraded" && break
  sleep 0.5
done
in_sd() { nsenter -t "$P" -a "$@"; }
sctl() { in_sd /tmp/sd/bin/systemctl "$@"; }
say "systemd pid (host) $P: $(sctl is-system-running 2>&1) at $(el) s"
sctl --failed --no-legend --no-pager 2>&1 | head -5 | tee -a "$rep" >&2

# --- the shipped unit, rendered by the shipped tool ---------------------------------------------
in_sd env SGLANG_MODEL_TEMPLATE="$root/units/sglang-supervisor@.service" SGLANG_MODEL_UNIT_DIR=/run/systemd/system \
  SGLANG_MODEL_NO_RELOAD=1 sh "$root/units/sglang-model" add seed 2>&1 | tee -a "$rep" >&2
mkdir -p /tmp/dropin
cat > /tmp/dropin/device.conf <<EOF
# Machine-local only (issue 16): where Python, the supervisor and SGLang live on the GPU machine.
[Service]
ExecStart=
ExecStart=$py -m sglang_supervisor run --config /etc/sglang-supervisor/seed.yaml
Environment=PYTHONPATH=/opt/sgs/daemon:/opt/sgs/pylib:/opt/sgs/site
Environment=HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 FLASHINFER_NO_DOWNLOAD=1 SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1
EOF
in_sd mkdir -p /run/systemd/system/sglang-seed.service.d
in_sd cp /tmp/dropin/device.conf /run/systemd/system/sglang-seed.service.d/device.conf
sctl daemon-reload
in_sd grep -c . /run/systemd/system/sglang-seed.service | sed 's/^/unit lines: /' | tee -a "$rep" >&2
say "== systemd-analyze security (exposure)"
in_sd /tmp/sd/usr/bin/systemd-analyze security sglang-seed.service --no-pager 2>&1 | tail -1 | tee -a "$rep" >&2

# --- start, wait for active ----------------------------------------------------------------------
ts=$(date +%s.%N)
sctl start --no-block sglang-seed.service
state=
for _ in $(seq 1 $((WAIT_S * 2))); do
  state=$(sctl show -p ActiveState --value sglang-seed.service)
  sub=$(sctl show -p SubState --value sglang-seed.service)
  [ "$state" = active ] && break
  [ "$state" = failed ] && break
  sleep 0.5
done
t_active=$(python3 -c "import time;print(round(time.time()-$ts,1))")
say "state after start: $state/$sub at $t_active s"
[ "$state" = active ]; ok $? "unit active (Type=notify READY=1 reached systemd) ${t_active} s after systemctl start"
sctl status sglang-seed.service --no-pager -l 2>&1 | head -25 | cut -c1-220 | tee -a "$rep" >&2
say "== journal (supervisor events, engine lines)"
in_sd /tmp/sd/bin/journalctl -u sglang-seed.service --no-pager -o short-monotonic 2>&1 | \
  grep -E "Capture|supervisor.ready|engine\.(spawned|failed|capture_end)|profile\.|READY|fired up|Error|error" | \
  head -40 | cut -c1-260 | tee -a "$rep" >&2
n_eng=$(in_sd /tmp/sd/bin/journalctl -u sglang-seed.service --no-pager -o cat 2>/dev/null | grep -c "Capture .* CUDA graph end")
[ "${n_eng:-0}" -gt 0 ]; ok $? "journald holds the engine's capture lines ($n_eng)"
fields=$(in_sd /tmp/sd/bin/journalctl -u sglang-seed.service --no-pager -o json 2>/dev/null | \
  python3 -c "import sys,json
ready=[json.loads(l) for l in sys.stdin if '\"supervisor.ready\"' in l or 'supervisor.ready' in l]
print(json.dumps({k:v for k,v in (ready[0] if ready else {}).items() if not k.startswith('_') and k not in ('__CURSOR','__REALTIME_TIMESTAMP','__MONOTONIC_TIMESTAMP')})[:600])")
say "supervisor.ready journal fields: $fields"
echo "$fields" | grep -q PROFILE; ok $? "journald holds the supervisor's structured fields (PROFILE=...)"
# The ready event must come after the last capture end and before systemd saw active.
order=$(in_sd /tmp/sd/bin/journalctl -u sglang-seed.service --no-pager -o json 2>/dev/null | python3 -c "
import sys,json
last_cap=ready=None
for l in sys.stdin:
    d=json.loads(l); m=d.get('MESSAGE') or ''; t=int(d['__MONOTONIC_TIMESTAMP'])
    if isinstance(m,str) and 'CUDA graph end' in m: last_cap=t
    if isinstance(m,str) and 'supervisor.ready' in m and ready is None: ready=t
    if d.get('EVENT')=='supervisor.ready' and ready is None: ready=t
print(last_cap, ready, 'ok' if last_cap and ready and ready>last_cap else 'bad')")
say "last capture end vs supervisor.ready (monotonic us): $order"
echo "$order" | grep -q " ok$"; ok $? "supervisor.ready after the last capture end"
port=$(python3 -c "import yaml;print(yaml.safe_load(open('/etc/sglang-supervisor/seed.yaml'))['metrics']['address'])")
curl -s --max-time 10 "http://$port/metrics" > /tmp/metrics.txt
grep -E "^sglang_supervisor_gpu_(memory_used_bytes|memory_total_bytes|sm_clock_hertz|power_watts)" /tmp/metrics.txt | head -6 | tee -a "$rep" >&2
grep -q "^sglang_supervisor_gpu_memory_used_bytes" /tmp/metrics.txt; ok $? "NVML gauges on /metrics"

keys=$(ls /var/cache/sglang-supervisor/engine-cache 2>/dev/null | grep -c '^sglang-')
say "engine-cache keys: $(ls /var/cache/sglang-supervisor/engine-cache 2>&1 | tr '\n' ' ') ($(du -sh /var/cache/sglang-supervisor/engine-cache 2>/dev/null | cut -f1))"
[ "$keys" = 1 ]; ok $? "the kernel caches under CacheDirectory/engine-cache/KEY (one key)"

# --- optional (RESTART=1, issue 26): `systemctl restart` to READY with the caches the first start left
if [ "${RESTART:-0}" = 1 ]; then
  ts=$(date +%s.%N)
  # Type=notify: a blocking restart returns when the new start job is done (READY=1) or failed.
  timeout "$WAIT_S" nsenter -t "$P" -a /tmp/sd/bin/systemctl restart sglang-seed.service
  rrc=$?
  t_restart=$(python3 -c "import time;print(round(time.time()-$ts,1))")
  say "systemctl restart: rc=$rrc, $t_restart s to active (first start: $t_active s); state $(sctl show -p ActiveState --value sglang-seed.service)"
  say "engine-cache after the restart: $(du -sh /var/cache/sglang-supervisor/engine-cache/* 2>/dev/null | tr '\n\t' '  ')"
  [ "$rrc" = 0 ]; ok $? "systemctl restart reached READY again"
  python3 -c "import sys; sys.exit(0 if float('$t_restart') <= 0.5 * float('$t_active') else 1)"
  ok $? "systemctl restart ($t_restart s) <= 0.5 x the unit's first start ($t_active s)"
  # A crash under the unit: SIGKILL of the engine's leader; the supervisor relaunches it inside the
  # same unit (same PrivateTmp, same CacheDirectory). READY again = one more engine.ready event.
  readies() { in_sd /tmp/sd/bin/journalctl -u sglang-seed.service --no-pager -o cat EVENT=engine.ready 2>/dev/null | grep -c .; }
  main=$(sctl show -p MainPID --value sglang-seed.service)
  eng=$(in_sd pgrep -P "$main" -f "sglang" | head -1)
  n0=$(readies)
  say "SIGKILL: supervisor pid $main (unit's namespace), engine leader ${eng:-none}, engine.ready so far $n0"
  ts=$(date +%s.%N)
  [ -n "$eng" ] && in_sd kill -KILL "$eng"
  again=1
  # No engine found: nothing was killed, so there is nothing to wait for (device time is scarce).
  [ -n "$eng" ] && for _ in $(seq 1 $((WAIT_S))); do
    [ "$(readies)" -gt "$n0" ] && { again=0; break; }
    sleep 1
  done
  t_kill=$(python3 -c "import time;print(round(time.time()-$ts,1))")
  say "SIGKILL of the engine leader: READY again after $t_kill s (first start: $t_active s); unit $(sctl show -p ActiveState --value sglang-seed.service), supervisor pid $(sctl show -p MainPID --value sglang-seed.service)"
  [ "$again" = 0 ]; ok $? "the supervisor relaunched the SIGKILLed engine to READY inside the unit"
  python3 -c "import sys; sys.exit(0 if float('$t_kill') <= 0.5 * float('$t_active') else 1)"
  ok $? "relaunch after SIGKILL ($t_kill s, 1 s polls) <= 0.5 x the unit's first start ($t_active s)"
fi

# --- stop: GPU memory back to baseline --------------------------------------------------------------
ts=$(date +%s.%N)
sctl stop sglang-seed.service
t_stop=$(python3 -c "import time;print(round(time.time()-$ts,1))")
say "systemctl stop took $t_stop s; result: $(sctl show -p Result --value sglang-seed.service), ExecMainStatus=$(sctl show -p ExecMainStatus --value sglang-seed.service)"
sleep 2
after=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
say "GPU memory used after stop: $after MiB (before: $baseline)"
[ "$after" -le $((baseline + 256)) ]; ok $? "GPU memory back to baseline (+256 MiB) after systemctl stop"
left=$(ps -eo pid,stat,comm,args | grep -E "sglang::|sglang_supervisor" | grep -v grep | grep -v " Z" | wc -l)
[ "$left" = 0 ]; ok $? "no engine or supervisor process left ($left)"
in_sd /tmp/sd/bin/journalctl -u sglang-seed.service --no-pager -o cat 2>/dev/null | tail -12 | cut -c1-220 | tee -a "$rep" >&2
in_sd /tmp/sd/bin/journalctl --no-pager -o short-monotonic 2>/dev/null | xz -9 > "$OUT/journal.txt.xz"
cp /tmp/sdboot.log "$OUT/sdboot.log" 2>/dev/null
kill -TERM "$P" 2>/dev/null
say "systemd scenario: $fails failed checks, $(el) s"
exit $((fails > 0))
