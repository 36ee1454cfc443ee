mkdir -p a
echo 1 > a/x
cp -r a b
echo 2 > b/x
diff -r a b > /dev/null
echo "status $?"
