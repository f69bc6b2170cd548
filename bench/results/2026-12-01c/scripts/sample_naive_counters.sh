# every 15 s: unix time and the naive server's read counters
while true; do
  echo "$(date +%s.%N) $(curl -s 127.0.0.1:39204/metrics | grep -E '^decision_(batch_reads_sum|batch_reads_count|batch_duration_seconds_sum|questions_total|computed_tokens_total) ' | tr '\n' ' ')"
  sleep 15
done
