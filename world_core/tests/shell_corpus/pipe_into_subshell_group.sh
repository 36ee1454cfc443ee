printf '1\n2\n3\n' | { read -r a; read -r b; echo "$b $a"; }
