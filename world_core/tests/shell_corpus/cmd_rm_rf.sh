mkdir -p t/u/v
touch t/u/v/f t/g
rm -rf t
ls
echo done
