function hello { echo "keyword $1"; }
hello x
