echo one > log.txt
echo two >> log.txt
echo three >> log.txt
cat log.txt
