echo "she said \"hi\""
echo 'it'\''s'
echo $'a\tb'
