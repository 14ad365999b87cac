#!/usr/bin/env bash
# The docs_api test: builds the API reference and fails when a public option struct (a struct named *Options, or
# quant::QConfig, dist::StoreLimits), or a field of one, is undocumented (Doxygen's "is not documented" warnings for
# them), and on any warning that is not an "is not documented" one (a comment Doxygen cannot parse, a reference to a
# symbol that does not exist, a broken Markdown list: errors in the documentation that is there). The remaining
# "is not documented" warnings (members of public classes still without a comment) are counted, not failed on.
#   docs/check_docs.sh DOXYGEN DOXYFILE WARNINGS_LOG
set -euo pipefail
doxygen=$1 doxyfile=$2 log=$3
mkdir -p "$(dirname "$log")"
rm -f "$log"
"$doxygen" "$doxyfile" >/dev/null
[ -f "$log" ] || { echo "docs_api: doxygen wrote no warnings log ($log)"; exit 1; }
opt="ember::[A-Za-z0-9_:]*(Options|QConfig|StoreLimits)"
bad=$(grep -E "(Compound $opt is not documented|of (struct|class) $opt( |\.))" "$log" || true)
# A warning's message can run over several lines (doxygen's "Possible candidates:" lists): each line that does not
# start a new "file:line: warning:" belongs to the warning above it.
doc_errors=$(awk '/^([^ ]+:[0-9]+: )?(warning|error):/ { keep = ($0 !~ / is not documented\.$/) } keep' "$log")
n_undoc=$(grep -c "is not documented\." "$log" || true)
rc=0
if [ -n "$bad" ]; then
  echo "docs_api: public options without documentation (each field needs a /// or ///< comment: what it does, its"
  echo "          PyTorch name when it has one):"
  echo "$bad" | sed 's|^|  |'
  rc=1
fi
if [ -n "$doc_errors" ]; then
  echo "docs_api: Doxygen warnings other than \"is not documented\" (errors in the documentation's text or markup):"
  echo "$doc_errors" | sed 's|^|  |'
  rc=1
fi
[ "$rc" = 0 ] || exit 1
echo "docs_api: every public option struct and field is documented and the documentation has no errors" \
  "($n_undoc \"is not documented\" warnings left); html in $(dirname "$log")/html"
