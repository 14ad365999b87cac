#!/usr/bin/env bash
# The docs_api test: builds the API reference and fails when a public option struct (a struct named *Options, or
# quant::QConfig, dist::StoreLimits), or a field of one, is undocumented (Doxygen's "is not documented" warnings for
# them). Other warnings are counted, not failed on.
#   docs/check_docs.sh DOXYGEN DOXYFILE WARNINGS_LOG
set -euo pipefail
doxygen=$1 doxyfile=$2 log=$3
mkdir -p "$(dirname "$log")"
rm -f "$log"
"$doxygen" "$doxyfile" >/dev/null
[ -f "$log" ] || { echo "docs_api: doxygen wrote no warnings log ($log)"; exit 1; }
opt="ember::[A-Za-z0-9_:]*(Options|QConfig|StoreLimits)"
bad=$(grep -E "(Compound $opt is not documented|of (struct|class) $opt( |\.))" "$log" || true)
n_other=$(grep -c "warning:" "$log" || true)
if [ -n "$bad" ]; then
  echo "docs_api: public options without documentation (each field needs a /// or ///< comment: what it does, its"
  echo "          PyTorch name when it has one):"
  echo "$bad" | sed 's|^|  |'
  exit 1
fi
echo "docs_api: every public option struct and field is documented ($n_other other warnings); html in $(dirname "$log")/html"
