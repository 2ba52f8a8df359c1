#!/usr/bin/env bash
# Builds lockd's packages into the target directory (docs/deploy.md says how
# to install each):
#
#   scripts/package.sh deb      the Debian package, from the release build:
#                               target/debian/lockd_VERSION-1_ARCH.deb
#   scripts/package.sh static   a static binary for x86_64 Linux (musl):
#                               target/dist/lockd-VERSION-x86_64-unknown-linux-musl
#   scripts/package.sh          both
#
# deb: `cargo build --release --locked --bin lockd` (a no-op when the release
# build is fresh, as after scripts/test.sh), the manual pages written by the
# binary itself (`lockd manpages`, gzipped into target/release/man/), then
# cargo-deb --no-build, stripped. cargo-deb is pinned and installed from
# crates.io into target/cargo-deb/ on first use. The package's metadata is
# [package.metadata.deb] in Cargo.toml; its unit and sysusers.d entry are in
# deploy/debian/.
#
# static: the x86_64-unknown-linux-musl target of the Rust toolchain
# (`rustup target add`, which downloads its standard library once) and
# musl-gcc (Debian's musl-tools) for the C that jemalloc and ring compile;
# then the binary, stripped, with its SHA-256 beside it. The Dockerfile runs
# this step too. A step that cannot be done stops the script with the
# command that failed and its error.
#
# Prints the path of each package made. CARGO_TARGET_DIR is honoured.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
target_dir=${CARGO_TARGET_DIR:-$root/target}
case $target_dir in /*) ;; *) target_dir=$root/$target_dir ;; esac
cargo_deb_version=3.8.0
musl=x86_64-unknown-linux-musl
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
[ -n "$version" ] || { echo "package: no version in Cargo.toml" >&2; exit 1; }

what=${1:-all}
case $what in
  deb | static | all) ;;
  *) echo "usage: scripts/package.sh [deb|static|all]" >&2; exit 2 ;;
esac

# The pinned cargo-deb, installed into the target directory once.
cargo_deb() {
  local dir=$target_dir/cargo-deb
  local bin=$dir/bin/cargo-deb
  if ! [ -x "$bin" ] || [ "$("$bin" --version 2>/dev/null)" != "cargo-deb $cargo_deb_version" ]; then
    echo "package: installing cargo-deb $cargo_deb_version into $dir" >&2
    cargo install cargo-deb --version "$cargo_deb_version" --locked --quiet \
      --root "$dir" --target-dir "$dir/build"
  fi
  echo "$bin"
}

build_deb() {
  scripts/ensure-deps.sh dpkg-deb gzip
  cargo build --release --locked --bin lockd
  local lockd=$target_dir/release/lockd
  # The pages come from the binary being packaged; cargo-deb reads them
  # from target/release/man/ (its assets name target/release/, which it
  # maps to the real target directory).
  local man=$target_dir/release/man
  rm -rf "$man"
  mkdir -p "$man"
  # The pages' date, and cargo-deb's file times: the commit's, so that a
  # package built twice from one commit is the same.
  if [ -z "${SOURCE_DATE_EPOCH:-}" ] && git rev-parse --git-dir >/dev/null 2>&1; then
    SOURCE_DATE_EPOCH=$(git log -1 --format=%ct)
    export SOURCE_DATE_EPOCH
  fi
  "$lockd" manpages "$man" >/dev/null
  gzip -9n "$man"/*.1
  local bin
  bin=$(cargo_deb)
  rm -rf "$target_dir/debian"
  # (cargo-deb prints the package's path: this script prints it once, below.)
  "$bin" deb --no-build --locked --strip --quiet --output "$target_dir/debian/" >&2
  local deb
  deb=$(ls "$target_dir"/debian/lockd_"$version"-1_*.deb)
  echo "$deb"
}

build_static() {
  if ! rustup target list --installed | grep -qx "$musl"; then
    echo "package: rustup target add $musl" >&2
    if ! out=$(rustup target add "$musl" 2>&1); then
      echo "$out" >&2
      echo "package: BLOCKED: 'rustup target add $musl' failed (above), so the static binary cannot be built here" >&2
      return 1
    fi
  fi
  scripts/ensure-deps.sh musl-gcc
  # cc-rs would find musl-gcc by itself; naming it says which compiler
  # builds jemalloc and ring.
  CC_x86_64_unknown_linux_musl=musl-gcc \
    cargo build --release --locked --bin lockd --target "$musl"
  local dist=$target_dir/dist
  local out=$dist/lockd-$version-$musl
  mkdir -p "$dist"
  cp "$target_dir/$musl/release/lockd" "$out"
  # The release profile keeps line tables (for profiling); the shipped
  # binary needs none.
  strip "$out"
  (cd "$dist" && sha256sum "$(basename "$out")" >"$(basename "$out").sha256")
  echo "$out"
}

case $what in
  deb) build_deb ;;
  static) build_static ;;
  all) build_deb; build_static ;;
esac
