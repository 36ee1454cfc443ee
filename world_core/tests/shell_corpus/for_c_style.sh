for ((i=0; i<5; i++)); do printf '%d ' "$i"; done
echo
