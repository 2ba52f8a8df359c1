#!/usr/bin/env bash
# Tests lockd's packages as a user gets them (scripts/test.sh runs it in a
# whole run, after the release build):
#
# 1. the .deb: scripts/package.sh deb (cargo-deb --no-build over the release
#    build); its control fields, files, conffiles and maintainer scripts
#    (dpkg-deb -I, -c, -e); the settings file, unit and sysusers.d entry it
#    carries are the repository's; its manual pages render without a warning
#    (groff);
# 2. the unit: `systemd-analyze verify` (which reads every key; the only
#    complaint allowed is that /usr/bin/lockd is not installed on this host),
#    the hardening keys and their values, and `systemd-analyze security
#    --offline` (an exposure of at most 2.0, "OK");
# 3. an install into a throwaway root, never this system: dpkg --root on an
#    empty temporary directory with --force-script-chrootless, so that the
#    maintainer scripts run with DPKG_ROOT (systemd-sysusers --root makes the
#    user lockd there, deb-systemd-helper enables the unit there), and
#    systemctl and deb-systemd-invoke stubbed, so nothing reaches this
#    machine's systemd; a changed conffile kept over a reinstall; remove and
#    purge;
# 4. the installed /usr/bin/lockd: --version, -V, --help, and `serve` with
#    the installed /etc/lockd/lockd.toml, as user nobody, under the kernel's
#    memory-deny-write-execute (PR_SET_MDWE, what the unit's
#    MemoryDenyWriteExecute= asks of jemalloc and ring), against a real
#    redis-server on a free loopback port: curl takes a lock, is refused it
#    a second time, inspects it and releases it; SIGTERM stops it with 0;
# 5. the static binary: scripts/package.sh static (rustup's
#    x86_64-unknown-linux-musl target and musl-gcc), `file` and `ldd` say it
#    is statically linked, and it runs as in 4. LOCKD_PACKAGE_STATIC=skip
#    leaves it out, and says so in the last line.
#
# Every part runs even when another failed; a failure names its part and
# the check, and the script then exits 1. Debian's dpkg, groff, file,
# systemd (systemd-analyze, systemd-sysusers), musl-tools, curl,
# redis-server and python3 are installed when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# dpkg wants ldconfig and start-stop-daemon, which are in the sbin folders.
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
scripts/ensure-deps.sh dpkg-deb dpkg gzip groff file strip systemd-analyze \
  systemd-sysusers setpriv curl python3 redis-server redis-cli /bin/kill
. scripts/servers.sh

target_dir=${CARGO_TARGET_DIR:-$root/target}
case $target_dir in /*) ;; *) target_dir=$root/$target_dir ;; esac
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
arch=$(dpkg --print-architecture)
# Outside the repository, readable by nobody (the packaged lockd runs as
# nobody), removed at exit.
work=$(mktemp -d)
chmod 755 "$work"
trap 'cleanup; rm -rf "$work"' EXIT

redis_port=$(free_port)
start_redis "$redis_port" "$work/redis.log"

failed=()
# Runs "$@" as one part, with errexit on (a function called in an `if`
# would run with it off), and records the part's name when it fails.
part() {
  local name=$1
  shift
  echo "package-tests: $name" >&2
  (set -e; "$@") &
  if wait $!; then
    echo "package-tests: ok: $name" >&2
  else
    echo "package-tests: FAILED: $name" >&2
    failed+=("$name")
  fi
}
# Ends the part with a message saying what did not hold.
die() { echo "package-tests:   $*" >&2; exit 1; }
# Fails unless the file $1 contains the fixed line $2 (a whole line).
has_line() { grep -qxF -- "$2" "$1" || die "$1 has no line '$2'"; }

# --- 1. the .deb -----------------------------------------------------------

build_deb() {
  local deb
  deb=$(scripts/package.sh deb)
  [ -f "$deb" ] || die "scripts/package.sh deb printed '$deb', which is no file"
  echo "$deb" >"$work/deb-path"
}

check_deb_contents() {
  local deb=$1 control=$work/control files=$work/files x=$work/extracted
  dpkg-deb -I "$deb" >"$work/info"
  dpkg-deb -f "$deb" >"$control"
  has_line "$control" "Package: lockd"
  has_line "$control" "Version: $version-1"
  has_line "$control" "Architecture: $arch"
  has_line "$control" "Section: net"
  grep -q '^Maintainer: .' "$control" || die "no Maintainer"
  local depends
  depends=$(sed -n 's/^Depends: //p' "$control")
  case $depends in *"libc6 (>= "*) ;; *) die "Depends has no libc6 version: $depends" ;; esac
  case $depends in
    *"systemd | systemd-standalone-sysusers | systemd-sysusers"*) ;;
    *) die "Depends has no provider of systemd-sysusers, which the postinst runs: $depends" ;;
  esac
  dpkg-deb -c "$deb" >"$files"
  # name, then the mode and owner it must have.
  for want in \
    "./usr/bin/lockd -rwxr-xr-x root/root" \
    "./etc/lockd/lockd.toml -rw-r--r-- root/root" \
    "./usr/lib/systemd/system/lockd.service -rw-r--r-- root/root" \
    "./usr/lib/sysusers.d/lockd.conf -rw-r--r-- root/root" \
    "./usr/share/man/man1/lockd.1.gz -rw-r--r-- root/root" \
    "./usr/share/man/man1/lockd-serve.1.gz -rw-r--r-- root/root" \
    "./usr/share/doc/lockd/copyright -rw-r--r-- root/root"; do
    set -- $want
    # (dpkg-deb shows the owner as names or as numbers, 0/0.)
    awk -v p="$1" -v m="$2" -v o="$3" '$6 == p && $1 == m && ($2 == o || $2 == "0/0") { found = 1 } END { exit !found }' "$files" ||
      die "dpkg-deb -c lists no $1 with mode $2 and owner $3"
  done
  # Every path is under /usr or /etc (Debian's policy: nothing in /usr/local,
  # /opt, /home, ...).
  if awk '$6 !~ /^\.\/(usr|etc)(\/|$)/ && $6 != "./"' "$files" | grep .; then
    die "paths outside /usr and /etc (above)"
  fi
  mkdir -p "$work/control.d"
  dpkg-deb -e "$deb" "$work/control.d"
  [ "$(cat "$work/control.d/conffiles")" = /etc/lockd/lockd.toml ] ||
    die "conffiles is not exactly /etc/lockd/lockd.toml: $(cat "$work/control.d/conffiles")"
  for script in postinst prerm postrm; do
    [ -x "$work/control.d/$script" ] || die "no executable $script"
    sh -n "$work/control.d/$script" || die "$script is not valid sh"
  done
  has_line "$work/control.d/postinst" '   systemd-sysusers ${DPKG_ROOT:+--root="$DPKG_ROOT"} lockd.conf'
  grep -q 'deb-systemd-helper enable lockd.service' "$work/control.d/postinst" || die "the postinst does not enable lockd.service"
  grep -q '_dh_action=restart' "$work/control.d/postinst" || die "the postinst does not restart lockd.service after an upgrade"
  grep -q 'deb-systemd-invoke stop lockd.service' "$work/control.d/prerm" || die "the prerm does not stop lockd.service"
  grep -q 'deb-systemd-helper purge lockd.service' "$work/control.d/postrm" || die "the postrm does not purge lockd.service's state"
  ! grep -q '#DEBHELPER#' "$work/control.d"/* || die "a maintainer script kept #DEBHELPER#"

  dpkg-deb -x "$deb" "$x"
  cmp "$x/etc/lockd/lockd.toml" config/lockd.example.toml ||
    die "the packaged /etc/lockd/lockd.toml is not config/lockd.example.toml"
  cmp "$x/usr/lib/systemd/system/lockd.service" deploy/debian/lockd.service ||
    die "the packaged unit is not deploy/debian/lockd.service"
  cmp "$x/usr/lib/sysusers.d/lockd.conf" deploy/debian/lockd.sysusers ||
    die "the packaged sysusers.d entry is not deploy/debian/lockd.sysusers"
  file "$x/usr/bin/lockd" | grep -q ', stripped' || die "the packaged binary is not stripped: $(file "$x/usr/bin/lockd")"

  # A page per subcommand that --help lists, and each renders cleanly.
  local subcommands
  subcommands=$("$x/usr/bin/lockd" --help | awk '/^Commands:/ { on = 1; next } on && /^  [a-z]/ { print $1 } on && /^$/ { exit }')
  [ -n "$subcommands" ] || die "lockd --help lists no subcommand"
  for sub in $subcommands; do
    [ "$sub" = help ] && continue
    [ -f "$x/usr/share/man/man1/lockd-$sub.1.gz" ] || die "no manual page lockd-$sub.1.gz"
  done
  for page in "$x"/usr/share/man/man1/*.1.gz; do
    local warnings
    warnings=$(gzip -dc "$page" | groff -t -man -ww -z -Tutf8 2>&1) || die "groff failed on $page: $warnings"
    [ -z "$warnings" ] || die "groff warns on $(basename "$page"): $warnings"
  done
  gzip -dc "$x/usr/share/man/man1/lockd.1.gz" >"$work/lockd.1"
  grep -q 'lockd\\-serve(1)' "$work/lockd.1" || die "lockd(1) does not name lockd-serve(1)"
  gzip -dc "$x/usr/share/man/man1/lockd-serve.1.gz" >"$work/lockd-serve.1"
  for section in OPTIONS LISTENING ACCESS REDIS '"LEASES AND LIMITS"' '"METRICS AND LOGS"' SETTINGS ENVIRONMENT SIGNALS '"EXIT STATUS"' FILES; do
    has_line "$work/lockd-serve.1" ".SH $section"
  done
  gzip -dc "$x/usr/share/man/man1/lockd.1.gz" | grep -qF "v$version" || die "lockd(1) does not give version $version"
}

# --- 2. the unit -----------------------------------------------------------

check_unit() {
  local unit=$work/extracted/usr/lib/systemd/system/lockd.service
  [ -f "$unit" ] || die "no unit in the package"
  # The keys the unit must set, with their values (checked even where
  # systemd-analyze reads them too: it warns on a bad value, then ignores it).
  python3 - "$unit" <<'EOF' || die "the unit's keys (above)"
import sys
want = {
    ("Unit", "Documentation"): "man:lockd-serve(1)",
    ("Service", "Type"): "exec",
    ("Service", "User"): "lockd",
    ("Service", "Group"): "lockd",
    ("Service", "ExecStart"): "/usr/bin/lockd serve --config /etc/lockd/lockd.toml",
    ("Service", "EnvironmentFile"): "-/etc/default/lockd",
    ("Service", "RestartPreventExitStatus"): "2",
    ("Service", "NoNewPrivileges"): "true",
    ("Service", "CapabilityBoundingSet"): "",
    ("Service", "AmbientCapabilities"): "",
    ("Service", "ProtectSystem"): "strict",
    ("Service", "ProtectHome"): "true",
    ("Service", "PrivateTmp"): "true",
    ("Service", "PrivateDevices"): "true",
    ("Service", "ProtectKernelTunables"): "true",
    ("Service", "ProtectKernelModules"): "true",
    ("Service", "ProtectKernelLogs"): "true",
    ("Service", "ProtectControlGroups"): "true",
    ("Service", "RestrictAddressFamilies"): "AF_INET AF_INET6 AF_UNIX",
    ("Service", "RestrictNamespaces"): "true",
    ("Service", "LockPersonality"): "true",
    ("Service", "MemoryDenyWriteExecute"): "true",
    ("Service", "SystemCallArchitectures"): "native",
    ("Install", "WantedBy"): "multi-user.target",
}
seen, section = {}, None
for number, raw in enumerate(open(sys.argv[1]), 1):
    line = raw.strip()
    if not line or line[0] in "#;":
        continue
    if line.startswith("["):
        section = line.strip("[]")
        continue
    key, sep, value = line.partition("=")
    if not sep:
        sys.exit(f"line {number} is no key=value: {line}")
    seen.setdefault((section, key.strip()), []).append(value.strip())
bad = []
for (section, key), value in want.items():
    got = seen.get((section, key))
    if got is None:
        bad.append(f"[{section}] {key}= is missing")
    elif got[-1] != value:
        bad.append(f"[{section}] {key}={got[-1]!r}, not {value!r}")
for message in bad:
    print("package-tests:   " + message, file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
  # verify exits 1 for the one thing this host lacks, the binary at
  # /usr/bin/lockd (the package has it: checked in part 1); any other line
  # (an unknown key, a value it cannot parse, a missing command) fails.
  local out
  out=$(systemd-analyze verify --man=no "$unit" 2>&1) || true
  local others
  others=$(printf '%s\n' "$out" | grep -v -x -F 'lockd.service: Command /usr/bin/lockd is not executable: No such file or directory' | grep . || true)
  [ -z "$others" ] || die "systemd-analyze verify: $others"
  [ -x "$work/extracted/usr/bin/lockd" ] || die "the unit's ExecStart, /usr/bin/lockd, is not in the package"
  echo "package-tests:   systemd-analyze verify: no complaint but the uninstalled /usr/bin/lockd" >&2
  # The hardening as systemd scores it: 0 (locked down) to 10 (unsafe).
  local exposure
  exposure=$(systemd-analyze security --offline=true --no-pager "$unit" 2>&1 |
    sed -n 's/.*Overall exposure level for lockd.service: \([0-9.]*\).*/\1/p')
  [ -n "$exposure" ] || die "systemd-analyze security --offline gave no exposure level"
  python3 -c "import sys; sys.exit(0 if float('$exposure') <= 2.0 else 1)" ||
    die "systemd-analyze security: exposure $exposure, above 2.0"
  echo "package-tests:   systemd-analyze security --offline: exposure $exposure" >&2
}

# --- 3. an install into a throwaway root ----------------------------------

# This system's users, packages and enabled units.
host_state() {
  sha256sum /etc/passwd /etc/group /var/lib/dpkg/status
  ls -la /etc/systemd/system /etc/systemd/system/multi-user.target.wants 2>/dev/null || true
  ls /usr/bin/lockd /etc/lockd 2>/dev/null || true
}

install_into_a_throwaway_root() {
  local deb=$1 r=$work/root stubs=$work/stubs
  mkdir -p "$r/var/lib/dpkg/info" "$r/var/lib/dpkg/updates" "$r/etc" "$stubs"
  touch "$r/var/lib/dpkg/status" "$r/var/lib/dpkg/available"
  # The maintainer scripts call these when /run/systemd/system exists, on
  # the host whatever DPKG_ROOT says: stubs keep them off this machine.
  for tool in systemctl deb-systemd-invoke; do
    printf '#!/bin/sh\necho "%s $*" >>"%s/stub-calls"\n' "$tool" "$work" >"$stubs/$tool"
    chmod +x "$stubs/$tool"
  done
  # --path-include: a system's dpkg.cfg.d may exclude /usr/share/man or
  # /usr/share/doc (slim images do); this root gets every file.
  local dpkg=(dpkg --root="$r" --log="$work/dpkg.log" --force-script-chrootless
    --force-depends --path-include='/*')
  # What this system has, to check that the install left it alone.
  host_state >"$work/host-before"
  PATH=$stubs:$PATH "${dpkg[@]}" --install "$deb" >"$work/dpkg-install.out" 2>&1 ||
    die "dpkg --install into the throwaway root failed: $(cat "$work/dpkg-install.out")"
  [ "$(dpkg-query --root="$r" -W -f '${Status} ${Version}' lockd)" = "install ok installed $version-1" ] ||
    die "dpkg does not list lockd $version-1 as installed: $(dpkg-query --root="$r" -W lockd 2>&1)"
  [ -x "$r/usr/bin/lockd" ] || die "no /usr/bin/lockd after the install"
  [ -f "$r/usr/share/man/man1/lockd.1.gz" ] || die "no lockd(1) after the install"
  # The postinst's systemd-sysusers made the user and its group, in the root.
  grep -q '^lockd:x:[0-9]*:[0-9]*:lockd distributed lock service:/nonexistent:/usr/sbin/nologin$' "$r/etc/passwd" ||
    die "no system user lockd in the root's /etc/passwd: $(cat "$r/etc/passwd")"
  grep -q '^lockd:x:' "$r/etc/group" || die "no group lockd in the root's /etc/group"
  local uid
  uid=$(awk -F: '$1 == "lockd" { print $3 }' "$r/etc/passwd")
  [ "$uid" -lt 1000 ] || die "lockd's uid $uid is not a system uid"
  # ... and deb-systemd-helper enabled the unit, in the root.
  [ "$(readlink "$r/etc/systemd/system/multi-user.target.wants/lockd.service")" = /usr/lib/systemd/system/lockd.service ] ||
    die "lockd.service is not enabled in the root (no multi-user.target.wants link)"

  # A conffile the admin changed is kept when the package is installed again.
  echo "# changed by the admin" >>"$r/etc/lockd/lockd.toml"
  PATH=$stubs:$PATH "${dpkg[@]}" --force-confold --install "$deb" >"$work/dpkg-reinstall.out" 2>&1 ||
    die "dpkg --install again failed: $(cat "$work/dpkg-reinstall.out")"
  tail -n1 "$r/etc/lockd/lockd.toml" | grep -qx '# changed by the admin' ||
    die "the admin's change to /etc/lockd/lockd.toml was lost on a reinstall"

  # A copy of the installed root, for part 4 (remove and purge come next).
  cp -a "$r" "$work/installed"

  PATH=$stubs:$PATH "${dpkg[@]}" --remove lockd >"$work/dpkg-remove.out" 2>&1 ||
    die "dpkg --remove failed: $(cat "$work/dpkg-remove.out")"
  [ ! -e "$r/usr/bin/lockd" ] || die "/usr/bin/lockd is left after dpkg --remove"
  [ -f "$r/etc/lockd/lockd.toml" ] || die "dpkg --remove took the conffile (only a purge should)"
  PATH=$stubs:$PATH "${dpkg[@]}" --purge lockd >"$work/dpkg-purge.out" 2>&1 ||
    die "dpkg --purge failed: $(cat "$work/dpkg-purge.out")"
  [ ! -e "$r/etc/lockd/lockd.toml" ] || die "/etc/lockd/lockd.toml is left after dpkg --purge"
  [ ! -e "$r/etc/systemd/system/multi-user.target.wants/lockd.service" ] ||
    die "the unit's enable link is left after dpkg --purge"
  host_state >"$work/host-after"
  cmp -s "$work/host-before" "$work/host-after" ||
    die "the install changed this system: $(diff "$work/host-before" "$work/host-after")"
  if [ -s "$work/stub-calls" ]; then
    echo "package-tests:   the maintainer scripts called (stubbed): $(tr '\n' ';' <"$work/stub-calls")" >&2
  fi
}

# --- 4. the installed lockd runs -------------------------------------------

# Sets PR_SET_MDWE (memory-deny-write-execute, kept across exec), then execs
# its arguments. Exits 3 when the kernel has no PR_SET_MDWE (before 6.3).
cat >"$work/mdwe.py" <<'EOF'
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1
if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
    print("prctl(PR_SET_MDWE): " + os.strerror(ctypes.get_errno()), file=sys.stderr)
    sys.exit(3)
os.execvp(sys.argv[1], sys.argv[1:])
EOF

# The version, the help, and a lock taken and released through `lockd serve`
# of the binary $1 with the settings file $2, as nobody, under MDWE.
check_binary_runs() {
  local lockd=$1 config=$2
  [ "$("$lockd" --version)" = "lockd $version" ] || die "'lockd --version' printed '$("$lockd" --version)', not 'lockd $version'"
  [ "$("$lockd" -V)" = "lockd $version" ] || die "'lockd -V' printed '$("$lockd" -V)'"
  "$lockd" --help >"$work/help.out"
  grep -q '^Usage: lockd <COMMAND>$' "$work/help.out" || die "lockd --help has no usage line"
  "$lockd" serve --help >"$work/serve-help.out"
  for heading in "Usage: lockd serve [OPTIONS]" Options: Listening: Access: Redis: "Leases and limits:" "Metrics and logs:" Settings: Environment: Signals: "Exit status:" Files:; do
    has_line "$work/serve-help.out" "$heading"
  done

  python3 "$work/mdwe.py" true 2>/dev/null || {
    local why=$?
    [ $why -eq 3 ] && die "this kernel ($(uname -r)) has no PR_SET_MDWE: memory-deny-write-execute cannot be checked here"
    die "the MDWE helper failed ($why)"
  }
  # As nobody when this runs as root (as CI does); else as the caller.
  local as_nobody=() uid=65534
  if [ "$(id -u)" -eq 0 ]; then
    as_nobody=(setpriv --reuid=65534 --regid=65534 --clear-groups)
  else
    uid=$(id -u)
    echo "package-tests:   not root: lockd runs as uid $uid, not as nobody" >&2
  fi
  local port log=$work/serve-$(basename "$lockd").log
  port=$(free_port)
  # The environment overrides the file (its listen and redis_url), as it
  # does in the unit with /etc/default/lockd.
  env -i PATH="$PATH" LOCKD_LISTEN="127.0.0.1:$port" LOCKD_REDIS_URL="redis://127.0.0.1:$redis_port" \
    python3 "$work/mdwe.py" "${as_nobody[@]}" "$lockd" serve --config "$config" >"$log" 2>&1 &
  local pid=$!
  trap 'kill $pid 2>/dev/null || true' EXIT
  local base=http://127.0.0.1:$port up=
  for _ in $(seq 300); do
    if curl -sf -m 2 "$base/healthz" >/dev/null 2>&1; then up=1; break; fi
    kill -0 $pid 2>/dev/null || die "lockd serve exited at start-up: $(cat "$log")"
    sleep 0.1
  done
  [ -n "$up" ] || die "lockd serve did not answer /healthz within 30 s: $(cat "$log")"
  grep -q 'NOT shared' "$log" && die "lockd runs in --dev mode, not on Redis"
  local status owner
  owner=$(awk '/^Uid:/ { print $2 }' "/proc/$pid/status")
  [ "$owner" = "$uid" ] || die "lockd runs as uid $owner, not $uid"
  status=$(curl -s -m 10 -o "$work/grant.json" -w '%{http_code}' -X POST "$base/locks/package-test?ttl_ms=30000")
  [ "$status" = 201 ] || die "acquire answered $status: $(cat "$work/grant.json")"
  local token
  token=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["token"])' "$work/grant.json")
  status=$(curl -s -m 10 -o /dev/null -w '%{http_code}' -X POST "$base/locks/package-test?ttl_ms=30000")
  [ "$status" = 409 ] || die "a second acquire answered $status, not 409"
  status=$(curl -s -m 10 -o "$work/state.json" -w '%{http_code}' "$base/locks/package-test")
  [ "$status" = 200 ] || die "inspect answered $status"
  grep -q '"held":true' "$work/state.json" || die "inspect says: $(cat "$work/state.json")"
  [ "$(redis-cli -p "$redis_port" --scan --pattern 'lockd:*' | grep -c .)" -gt 0 ] || die "nothing of the lock is in Redis"
  status=$(curl -s -m 10 -o /dev/null -w '%{http_code}' -X DELETE "$base/locks/package-test" -H "Lock-Token: $token")
  [ "$status" = 204 ] || die "release answered $status, not 204"
  status=$(curl -s -m 10 -o /dev/null -w '%{http_code}' "$base/locks/package-test")
  [ "$status" = 404 ] || die "after the release, inspect answered $status, not 404"
  kill -TERM $pid
  local code=0
  wait $pid || code=$?
  trap - EXIT
  [ $code -eq 0 ] || die "lockd exited $code after SIGTERM: $(cat "$log")"
  echo "package-tests:   $lockd: version, help, and a lock taken and released as nobody under MDWE" >&2
}

# --- 5. the static binary --------------------------------------------------

check_static() {
  local bin
  bin=$(scripts/package.sh static) || die "scripts/package.sh static failed (above)"
  [ -x "$bin" ] || die "scripts/package.sh static printed '$bin', which is no executable"
  local kind
  kind=$(file -b "$bin")
  case $kind in
    *"statically linked"* | *"static-pie linked"*) ;;
    *) die "file says it is not static: $kind" ;;
  esac
  local ldd_out
  ldd_out=$(ldd "$bin" 2>&1 || true)
  case $ldd_out in
    *"not a dynamic executable"* | *"statically linked"*) ;;
    *) die "ldd lists libraries: $ldd_out" ;;
  esac
  (cd "$(dirname "$bin")" && sha256sum -c --quiet "$(basename "$bin").sha256") || die "its .sha256 does not match"
  echo "package-tests:   $(basename "$bin"): $kind" >&2
  # Installed as docs/deploy.md says, under the name lockd (clap's usage
  # lines name the file).
  mkdir -p "$work/static"
  install -m 755 "$bin" "$work/static/lockd"
  check_binary_runs "$work/static/lockd" "$root/config/lockd.example.toml"
}

part "the .deb build (scripts/package.sh deb)" build_deb
if [ -s "$work/deb-path" ]; then
  deb=$(cat "$work/deb-path")
  part "the .deb's contents" check_deb_contents "$deb"
  if [ -d "$work/extracted" ]; then
    part "the systemd unit" check_unit
  else
    failed+=("the systemd unit (not checked: the .deb could not be extracted)")
  fi
  part "the install into a throwaway root" install_into_a_throwaway_root "$deb"
  if [ -x "$work/installed/usr/bin/lockd" ]; then
    part "the installed lockd" check_binary_runs "$work/installed/usr/bin/lockd" "$work/installed/etc/lockd/lockd.toml"
  else
    failed+=("the installed lockd (not run: the install failed)")
  fi
else
  failed+=("the .deb's contents, unit, install and binary (not checked: no .deb)")
fi
static=checked
if [ "${LOCKD_PACKAGE_STATIC:-}" = skip ]; then
  static="NOT checked (LOCKD_PACKAGE_STATIC=skip)"
  echo "package-tests: the static binary: NOT built nor checked, as LOCKD_PACKAGE_STATIC=skip asks" >&2
else
  part "the static binary (scripts/package.sh static)" check_static
fi

if [ ${#failed[@]} -gt 0 ]; then
  printf 'package-tests: FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "package-tests: the .deb (contents, unit, install, binary) passed; the static binary: $static" >&2
