#!/usr/bin/env bash
# The docs_api test: builds the API reference and fails when a public option struct (a struct named *Options, or
# quant::QConfig, dist::StoreLimits), or a field of one, is undocumented (Doxygen's "is not documented" warnings for
# them), and on any other warning at all: an undocumented public member, a comment Doxygen cannot parse, a reference
# to a symbol that does not exist, a broken Markdown list. Doxygen runs without warnings; what is internal is kept out
# of the reference in Doxyfile.in (EXCLUDE, EXCLUDE_SYMBOLS), each with its reason.
#   docs/check_docs.sh DOXYGEN DOXYFILE WARNINGS_LOG
set -euo pipefail
doxygen=$1 doxyfile=$2 log=$3
mkdir -p "$(dirname "$log")"
rm -f "$log"
"$doxygen" "$doxyfile" >/dev/null
[ -f "$log" ] || { echo "docs_api: doxygen wrote no warnings log ($log)"; exit 1; }
opt="ember::[A-Za-z0-9_:]*(Options|QConfig|StoreLimits)"
bad=$(grep -E "(Compound $opt is not documented|of (struct|class) $opt( |\.))" "$log" || true)

other=$(grep -v "^$" "$log" || true)
rc=0
if [ -n "$bad" ]; then
  echo "docs_api: public options without documentation (each field needs a /// or ///< comment: what it does, its"
  echo "          PyTorch name when it has one):"
  echo "$bad" | sed 's|^|  |'
  rc=1
fi
if [ -n "$other" ]; then
  echo "docs_api: Doxygen warnings (document the public member, fix the comment, or keep an internal name out of the"
  echo "          reference in docs/Doxyfile.in with the reason):"
  echo "$other" | sed 's|^|  |'
  rc=1
fi
[ "$rc" = 0 ] || exit 1
echo "docs_api: no Doxygen warnings (every public option struct and field documented); html in $(dirname "$log")/html"
