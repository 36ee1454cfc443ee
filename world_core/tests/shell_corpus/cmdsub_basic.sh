now=$(echo fixed)
echo "value: $now"
