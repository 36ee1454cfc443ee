printf 'version=1\nname=x\n' > conf
sed -i 's/version=1/version=2/' conf
cat conf
