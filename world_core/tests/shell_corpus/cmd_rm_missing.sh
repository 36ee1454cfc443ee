rm nothere 2>/dev/null
echo "status $?"
rm -f nothere
echo "status $?"
