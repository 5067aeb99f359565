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
#   xterm   the terminal of a lease's shell in the page (ES module and
#           its stylesheet), with its fit addon
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=$ROOT/console/vendor
PREACT=preact@11.2.0
PREACT_SHA512=fc77c723fecdf387ba1ab581277276f34cf798b6912620dc4af8ff03ecbfe006cb9cd0ffd549461ded6c47aa18b931b021dd273fb76a0d4f4e9cbc4c3d9ef106
HTM=htm@3.1.1
HTM_SHA512=f7cdd5ca0f0dc1413b26467a3663aaa4267eb21d5b2afda2613954933956980e490f669c2a8c5de0a5716cc9b15fff399ad7dd9c399316834a720e43180bf135
XTERM=@xterm/xterm@6.0.0
XTERM_SHA512=4d0c037501adc300edfb67202832e7d0845a4b162ed6d4948e029aad20e450cd193624915c5a63c44b2f73f66073992ae68989f95d1af3f908336583dec30e62
FIT=@xterm/addon-fit@0.11.0
FIT_SHA512=8d87204fac6d558867860c61dd08180e79cd3184dc7fc1256f1c45cd7d08668faf69b42a48f0230b7735c09aca079135f55c107a2f3d40289964ff3a0c23c5ee

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
npm pack --silent "$PREACT" "$HTM" "$XTERM" "$FIT" >/dev/null
check() {
    local file=$1 want=$2 got
    got=$(sha512sum "$file" | cut -c1-${#want})
    [ "$got" = "$want" ] || { echo "console-vendor: $file has SHA-512 $got..., not $want..." >&2; exit 1; }
}
check "preact-${PREACT#preact@}.tgz" "$PREACT_SHA512"
check "htm-${HTM#htm@}.tgz" "$HTM_SHA512"
check "xterm-xterm-${XTERM##*@}.tgz" "$XTERM_SHA512"
check "xterm-addon-fit-${FIT##*@}.tgz" "$FIT_SHA512"
mkdir -p preact htm xterm fit "$OUT"
tar -xzf "xterm-xterm-${XTERM##*@}.tgz" -C xterm
tar -xzf "xterm-addon-fit-${FIT##*@}.tgz" -C fit
cp xterm/package/lib/xterm.mjs "$OUT/xterm.mjs"
cp xterm/package/css/xterm.css "$OUT/xterm.css"
cp fit/package/lib/addon-fit.mjs "$OUT/addon-fit.mjs"
cp xterm/package/LICENSE "$OUT/LICENSE-xterm"
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
sed -i '/sourceMappingURL/d' "$OUT/preact.mjs" "$OUT/hooks.mjs" "$OUT/htm.mjs" "$OUT/xterm.mjs" "$OUT/addon-fit.mjs"
printf '%s\n' "$PREACT" "$HTM" "$XTERM" "$FIT" >"$OUT/VERSIONS"
echo "console-vendor: $PREACT, $HTM, $XTERM and $FIT in console/vendor/" >&2
