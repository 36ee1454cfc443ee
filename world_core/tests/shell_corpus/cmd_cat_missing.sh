cat nothere.txt 2>/dev/null
echo "status $?"
