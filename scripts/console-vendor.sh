#!/usr/bin/env bash
# The console's third-party code, fetched from the npm registry at pinned
# versions and checked against pinned SHA-512 digests, into console/vendor/
# (committed: the console needs no network when it runs, nor when the
# gateway is built). Run it to move to new versions: change them and their
# digests below, run it, commit console/vendor/.
#
#   preact  the components and hooks (ES modules; hooks' bare `preact`
#           import rewritten to the file beside it: the console's strict
#           Content Security Policy allows no inline import map)
#   htm     tagged templates for preact, instead of a JSX build step
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=$ROOT/console/vendor
PREACT=preact@11.2.0
PREACT_SHA512=fc77c723fecdf387ba1ab581277276f34cf798b6912620dc4af8ff03ecbfe006cb9cd0ffd549461ded6c47aa18b931b021dd273fb76a0d4f4e9cbc4c3d9ef106
HTM=htm@3.1.1
HTM_SHA512=f7cdd5ca0f0dc1413b26467a3663aaa4267eb21d5b2afda2613954933956980e490f669c2a8c5de0a5716cc9b15fff399ad7dd9c399316834a720e43180bf135

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
npm pack --silent "$PREACT" "$HTM" >/dev/null
check() {
    local file=$1 want=$2 got
    got=$(sha512sum "$file" | cut -c1-${#want})
    [ "$got" = "$want" ] || { echo "console-vendor: $file has SHA-512 $got..., not $want..." >&2; exit 1; }
}
check "preact-${PREACT#preact@}.tgz" "$PREACT_SHA512"
check "htm-${HTM#htm@}.tgz" "$HTM_SHA512"
mkdir -p preact htm "$OUT"
tar -xzf "preact-${PREACT#preact@}.tgz" -C preact
tar -xzf "htm-${HTM#htm@}.tgz" -C htm
cp preact/package/dist/preact.mjs "$OUT/preact.mjs"
sed 's#from"preact"#from"./preact.mjs"#g; s#from "preact"#from "./preact.mjs"#g' \
    preact/package/hooks/dist/hooks.mjs >"$OUT/hooks.mjs"
grep -q 'from"./preact.mjs"\|from "./preact.mjs"' "$OUT/hooks.mjs" || { echo "console-vendor: hooks.mjs imports preact some other way" >&2; exit 1; }
cp htm/package/dist/htm.module.js "$OUT/htm.mjs"
cp preact/package/LICENSE "$OUT/LICENSE-preact"
cp htm/package/LICENSE "$OUT/LICENSE-htm"
# Their source maps are not vendored: no reference to a missing file.
sed -i '/sourceMappingURL/d' "$OUT/preact.mjs" "$OUT/hooks.mjs" "$OUT/htm.mjs"
printf '%s\n%s\n' "$PREACT" "$HTM" >"$OUT/VERSIONS"
echo "console-vendor: $PREACT and $HTM in console/vendor/" >&2
