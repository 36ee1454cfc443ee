set -e
echo start
false
echo unreachable
