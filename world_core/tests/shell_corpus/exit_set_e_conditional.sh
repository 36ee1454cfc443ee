set -e
if false; then echo no; fi
false || true
echo survived
