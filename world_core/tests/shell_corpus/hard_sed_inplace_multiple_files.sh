echo 'v1' > a; echo 'v1' > b
sed -i 's/v1/v2/' a b
cat a b
