echo one | tee -a t.log > /dev/null
echo two | tee -a t.log > /dev/null
cat t.log
