#!/usr/bin/env bash
# Checks, or moves to another version, the Scalar script that /docs serves
# (src/http/pages/scalar/standalone.js.gz: the npm package
# @scalar/api-reference's dist/browser/standalone.js, gzipped).
#
#   scripts/update-scalar.sh           fetch the pinned version again with
#                                      `npm pack` and check that the vendored
#                                      file is that file, and that its SHA-384
#                                      is the integrity hash in docs.html
#   scripts/update-scalar.sh VERSION   vendor VERSION instead: write the new
#                                      file, and its path and hash into
#                                      docs.html and docs.rs; then check
#
# npm checks the package against the registry's own integrity hash; the
# SHA-384 printed here is what jsDelivr's page for the file shows (its
# "SRI" hash), for a check by another route. After an update, run
# `cargo test --lib pages::docs` and scripts/console-tests.sh (which opens
# /docs in Chromium and fails on any CSP violation: a new version may need
# the policy in docs.rs changed), and read Scalar's changelog for new
# features that call Scalar's servers (docs.html turns off those it knows).
# Needs npm, tar, gzip and openssl (or python3 for the hashes).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=src/http/pages
html=$dir/docs.html
rs=$dir/docs.rs
vendored=$dir/scalar/standalone.js.gz

pinned=$(sed -n 's|.*src="/docs/scalar/\([0-9][0-9.]*\)/standalone.js".*|\1|p' "$html")
[ -n "$pinned" ] || { echo "update-scalar: no /docs/scalar/VERSION/standalone.js in $html" >&2; exit 1; }
version=${1:-$pinned}
case $version in
  *[!0-9.]*|.*|*.) echo "update-scalar: VERSION must be X.Y.Z, not $version" >&2; exit 2 ;;
esac

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --loglevel=error "@scalar/api-reference@$version" >/dev/null) ||
  { echo "update-scalar: npm pack @scalar/api-reference@$version failed" >&2; exit 1; }
tar -xzf "$work"/scalar-api-reference-"$version".tgz -C "$work" package/dist/browser/standalone.js package/package.json
fetched=$work/package/dist/browser/standalone.js
license=$(sed -n 's/^  "license": "\(.*\)",$/\1/p' "$work/package/package.json")
[ "$license" = MIT ] || echo "update-scalar: warning: the package's license is now '$license', not MIT: update $dir/scalar/LICENSE" >&2

sri() { openssl dgst -sha384 -binary "$1" | openssl base64 -A; }
hash=$(sri "$fetched")

if [ "$version" != "$pinned" ]; then
  gzip -9 -n -c "$fetched" >"$vendored"
  sed -i "s|/docs/scalar/$pinned/standalone.js|/docs/scalar/$version/standalone.js|" "$html" "$rs"
  sed -i "s|integrity=\"sha384-[A-Za-z0-9+/=]*\"|integrity=\"sha384-$hash\"|" "$html"
  echo "update-scalar: vendored @scalar/api-reference@$version (was $pinned)" >&2
fi

# The checks: the vendored file is the package's, and docs.html names it by
# its path and hash.
gzip -dc "$vendored" >"$work/vendored.js"
if ! cmp -s "$work/vendored.js" "$fetched"; then
  echo "update-scalar: FAILED: $vendored is not @scalar/api-reference@$version's dist/browser/standalone.js" >&2
  exit 1
fi
grep -q "integrity=\"sha384-$hash\"" "$html" ||
  { echo "update-scalar: FAILED: $html does not name the file's hash sha384-$hash" >&2; exit 1; }
grep -q "src=\"/docs/scalar/$version/standalone.js\"" "$html" ||
  { echo "update-scalar: FAILED: $html does not load /docs/scalar/$version/standalone.js" >&2; exit 1; }
grep -q "\"/docs/scalar/$version/standalone.js\"" "$rs" ||
  { echo "update-scalar: FAILED: $rs does not serve /docs/scalar/$version/standalone.js" >&2; exit 1; }
echo "update-scalar: $vendored is @scalar/api-reference@$version's standalone.js, sha384-$hash, as $html says" >&2
