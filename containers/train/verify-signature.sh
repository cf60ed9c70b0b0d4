#!/usr/bin/env bash
# verify-signature.sh FILE SIGNATURE KEYFILE FINGERPRINT
#
# Exit 0 only if SIGNATURE is a good detached signature of FILE made by the key whose primary fingerprint is
# FINGERPRINT (40 hex digits; spaces ignored), read from KEYFILE. A key file that holds other keys, a signature by
# any of them, a changed file or a fingerprint that does not match fails with one line saying which. The keyring is
# a throwaway one: nothing is trusted or kept beyond this check. Used by containers/train/Dockerfile for the EFA
# installer (AWS publishes the tarball's .sig and the signing key's fingerprint in the EC2 user guide).
set -euo pipefail

if [ "$#" -ne 4 ]; then
  echo "usage: $0 FILE SIGNATURE KEYFILE FINGERPRINT" >&2
  exit 2
fi
file=$1 signature=$2 keyfile=$3
expected=$(tr -d ' ' <<<"$4" | tr '[:lower:]' '[:upper:]')
home=$(mktemp -d)
trap 'rm -rf "$home"' EXIT

if ! gpg --homedir "$home" --batch --quiet --import "$keyfile" 2>/dev/null; then
  echo "verify-signature: no OpenPGP key could be read from $keyfile (a failed download?)" >&2
  exit 1
fi
# gpg's machine-readable status lines: GOODSIG for a good signature, VALIDSIG whose last field is the signing
# key's primary fingerprint (GnuPG doc/DETAILS, "VALIDSIG").
status=$(gpg --homedir "$home" --batch --status-fd 1 --verify "$signature" "$file" 2>/dev/null || true)
if grep -Eq '^\[GNUPG:\] (EXPKEYSIG|REVKEYSIG) ' <<<"$status"; then
  echo "verify-signature: $signature was made by a key that has expired or been revoked" >&2
  exit 1
fi
if ! grep -q '^\[GNUPG:\] GOODSIG ' <<<"$status"; then
  echo "verify-signature: $signature is not a good signature of $file by a key in $keyfile" >&2
  exit 1
fi
signer=$(awk '$2 == "VALIDSIG" { print $NF }' <<<"$status")
if [ "$signer" != "$expected" ]; then
  echo "verify-signature: $file is signed by key $signer, not the expected $expected" >&2
  exit 1
fi
echo "verify-signature: $file: good signature by $expected"
