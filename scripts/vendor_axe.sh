#!/usr/bin/env bash
# Vendor axe-core (the accessibility engine the browser tests inject) from npm.
# Tests only: it lands in tests/assets/axe/ and is never served by the app.
# Usage: scripts/vendor_axe.sh [VERSION]   (needs npm; default: the pinned version)
set -euo pipefail
VERSION="${1:-4.14.1}"
cd "$(dirname "$0")/.."
DEST=tests/assets/axe
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
(cd "$WORK" && npm pack --silent "axe-core@$VERSION" >/dev/null)
tar -xzf "$WORK"/axe-core-"$VERSION".tgz -C "$WORK"
mkdir -p "$DEST"
cp "$WORK/package/axe.min.js" "$DEST/axe.min.js"
cp "$WORK/package/LICENSE" "$DEST/LICENSE"
printf 'axe-core %s (MPL-2.0), from npm by scripts/vendor_axe.sh\nsha256 %s\n' \
  "$VERSION" "$(sha256sum "$DEST/axe.min.js" | cut -d' ' -f1)" > "$DEST/VERSION"
echo "axe-core $VERSION -> $DEST"
