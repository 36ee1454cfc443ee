mkdir -p s/sub
echo deep > s/sub/f
cp -r s t
cat t/sub/f
