set -e
out=$(echo ok; false) || echo "caught $?"
echo "out=$out"
