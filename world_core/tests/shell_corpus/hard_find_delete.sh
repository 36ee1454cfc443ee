mkdir -p t
touch t/a.tmp t/b.tmp t/keep.txt
find t -name '*.tmp' -delete
ls t
