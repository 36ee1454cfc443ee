echo logged | tee out.log
cat out.log
