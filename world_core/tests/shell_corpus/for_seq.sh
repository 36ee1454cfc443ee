for i in $(seq 3 5); do echo "n=$i"; done
