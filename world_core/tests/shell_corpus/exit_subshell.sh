(exit 3)
echo "sub $?"
