gen() {
  for i in 1 2; do
    cat <<EOF
item $i of $1
EOF
  done
}
gen list > out.txt
cat out.txt
