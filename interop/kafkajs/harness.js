'use strict'
// KafkaJS (the version package.json pins) against one cluster: a fixed list of steps, one line
// each, "<step>: <outcome>". Outcomes hold only what two correct clusters both show (error types
// and codes, offsets, shapes, config values and sources), never ids, hosts or times, so the lines
// from Apache Kafka and from tidelog can be compared as they are (tests/compat/test_kafkajs.py).
// Usage: node harness.js <bootstrap host:port[,host:port...]>

const crypto = require('crypto')
const { Kafka, logLevel } = require('kafkajs')

const STEP_TIMEOUT_MS = 45000 // a hung step prints "timeout" and the next one runs

const bootstrap = process.argv[2]
if (!bootstrap) {
  console.error('usage: node harness.js <bootstrap>')
  process.exit(2)
}

// Small retries: a refused call fails in seconds instead of KafkaJS's default ~30 s of retrying.
const kafka = new Kafka({
  clientId: 'tidelog-kafkajs-harness',
  brokers: bootstrap.split(','),
  logLevel: logLevel.NOTHING,
  connectionTimeout: 5000,
  requestTimeout: 15000,
  retry: { retries: 3, initialRetryTime: 200, maxRetryTime: 2000 },
})

// The names are run-specific (a rerun against the same cluster must not meet its old topic) and
// never printed.
const suffix = crypto.randomBytes(4).toString('hex')
const topic = `kafkajs-${suffix}`
const group = `kafkajs-group-${suffix}`

// An error as its class name and Kafka error type/code, nested causes included:
// "KafkaJSNumberOfRetriesExceeded<KafkaJSProtocolError TOPIC_ALREADY_EXISTS(36)>".
function describeError (e) {
  if (e == null) return 'null'
  let text = e.name || 'Error'
  if (e.type) text += ` ${e.type}(${e.code})`
  if (Array.isArray(e.errors)) text += `[${e.errors.map(describeError).join(', ')}]`
  if (Array.isArray(e.partitions)) { // KafkaJSDeleteTopicRecordsError
    text += `[${e.partitions.filter(p => p.error).map(p => `${p.partition}:${describeError(p.error)}`).join(', ')}]`
  }
  if (Array.isArray(e.groups)) { // KafkaJSDeleteGroupsError
    text += `[${e.groups.filter(g => g.error).map(g => describeError(g.error)).join(', ')}]`
  }
  if (e.cause && e.cause !== e) text += `<${describeError(e.cause)}>`
  else if (e.originalError) text += `<${describeError(e.originalError)}>`
  return text
}

function withTimeout (promise, ms) {
  let timer
  const timeout = new Promise((resolve, reject) => {
    timer = setTimeout(() => reject(Object.assign(new Error('step timed out'), { name: 'StepTimeout' })), ms)
  })
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer))
}

async function step (name, fn) {
  let line
  try {
    const result = await withTimeout(Promise.resolve().then(fn), STEP_TIMEOUT_MS)
    line = `${name}: ok ${JSON.stringify(result === undefined ? null : result)}`
  } catch (e) {
    line = `${name}: error ${describeError(e)}`
  }
  console.log(line)
}

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms))

// Poll `fn` until `done(value)` (bounded); the last value either way.
async function until (fn, done, ms = 20000) {
  const deadline = Date.now() + ms
  for (;;) {
    const value = await fn()
    if (done(value) || Date.now() >= deadline) return value
    await sleep(200)
  }
}

function topicShape (t) {
  const partitions = [...t.partitions].sort((a, b) => a.partitionId - b.partitionId)
  return partitions.map(p => ({
    partition: p.partitionId,
    error: p.partitionErrorCode,
    replicas: p.replicas.length,
    isr: p.isr.length,
    leaderIsReplica: p.replicas.includes(p.leader),
  }))
}

function configEntries (result) {
  return result.resources.map(r => ({
    errorCode: r.errorCode,
    configs: r.configEntries
      .map(c => ({ name: c.configName, value: c.configValue, source: c.configSource, readOnly: c.readOnly, isDefault: c.isDefault, sensitive: c.isSensitive }))
      .sort((a, b) => a.name.localeCompare(b.name)),
  }))
}

async function main () {
  const admin = kafka.admin()
  await step('admin connect', () => admin.connect())

  await step('describeCluster', async () => {
    const c = await admin.describeCluster()
    return { brokers: c.brokers.length, controllerIsBroker: c.brokers.some(b => b.nodeId === c.controller) }
  })
  // No authorizer on either cluster: every ACL call is SECURITY_DISABLED.
  await step('describeAcls', async () => {
    const r = await admin.describeAcls({ resourceType: 1 /* ANY */, resourcePatternType: 1 /* ANY */, operation: 1 /* ANY */, permissionType: 1 /* ANY */ })
    return { errorCode: r.errorCode, resources: r.resources.length }
  })
  await step('createAcls', () => admin.createAcls({ acl: [{ resourceType: 2 /* TOPIC */, resourceName: topic, resourcePatternType: 3 /* LITERAL */, principal: 'User:alice', host: '*', operation: 3 /* READ */, permissionType: 3 /* ALLOW */ }] }))
  await step('deleteAcls', () => admin.deleteAcls({ filters: [{ resourceType: 1 /* ANY */, resourcePatternType: 1 /* ANY */, operation: 1 /* ANY */, permissionType: 1 /* ANY */ }] }))
  await step('createTopics', () =>
    admin.createTopics({ topics: [{ topic, numPartitions: 1, replicationFactor: 3 }], waitForLeaders: true, timeout: 30000 }))
  await step('createTopics existing', () =>
    admin.createTopics({ topics: [{ topic, numPartitions: 1, replicationFactor: 3 }], timeout: 30000 }))
  await step('createTopics replication factor 4', () =>
    admin.createTopics({ topics: [{ topic: `${topic}-rf4`, numPartitions: 1, replicationFactor: 4 }], timeout: 30000 }))
  await step('createTopics invalid config', () =>
    admin.createTopics({ topics: [{ topic: `${topic}-badconfig`, configEntries: [{ name: 'retention.ms', value: 'soon' }] }], timeout: 30000 }))

  await step('createTopics replica assignment', () =>
    admin.createTopics({ topics: [{ topic: `${topic}-assigned`, replicaAssignment: [{ partition: 0, replicas: [1, 2] }, { partition: 1, replicas: [2, 3] }] }], timeout: 30000 }))
  await step('fetchTopicMetadata', async () => {
    const md = await admin.fetchTopicMetadata({ topics: [topic] })
    return md.topics.map(topicShape)
  })

  await step('fetchTopicMetadata unknown topic', () => admin.fetchTopicMetadata({ topics: [`${topic}-unknown`] }))
  await step('listPartitionReassignments', () => admin.listPartitionReassignments({ topics: [{ topic, partitions: [0] }] }))
  await step('createPartitions to 3', () =>
    admin.createPartitions({ topicPartitions: [{ topic, count: 3 }], timeout: 30000 }))
  await step('createPartitions to 2', () =>
    admin.createPartitions({ topicPartitions: [{ topic, count: 2 }], timeout: 30000 }))
  await step('createPartitions unknown topic', () =>
    admin.createPartitions({ topicPartitions: [{ topic: `${topic}-unknown`, count: 3 }], timeout: 30000 }))
  await step('fetchTopicMetadata after createPartitions', async () => {
    const md = await until(() => admin.fetchTopicMetadata({ topics: [topic] }),
      m => m.topics[0].partitions.length === 3 && m.topics[0].partitions.every(p => p.leader >= 0))
    return md.topics.map(topicShape)
  })

  // Entries sorted by name: Kafka lists them in its config maps' (hash) order, tidelog by name.
  const topicResource = (names, includeSynonyms = false) => ({ resources: [{ type: 2 /* TOPIC */, name: topic, configNames: names }], includeSynonyms })
  const watched = ['retention.ms', 'min.insync.replicas', 'cleanup.policy']
  await step('describeConfigs', async () => configEntries(await admin.describeConfigs(topicResource(watched))))
  await step('describeConfigs with synonyms', async () => {
    const r = await admin.describeConfigs(topicResource(['segment.bytes', 'retention.ms'], true))
    return r.resources.map(x => x.configEntries
      .map(c => ({ name: c.configName, synonyms: c.configSynonyms.map(y => [y.configName, y.configValue, y.configSource]) }))
      .sort((a, b) => a.name.localeCompare(b.name)))
  })
  await step('describeConfigs unknown topic', async () => configEntries(await admin.describeConfigs(
    { resources: [{ type: 2, name: `${topic}-unknown` }], includeSynonyms: false })))
  await step('describeConfigs broker 1', async () => configEntries(await admin.describeConfigs(
    { resources: [{ type: 4 /* BROKER */, name: '1', configNames: ['log.retention.hours', 'num.partitions', 'min.insync.replicas'] }], includeSynonyms: false })))
  await step('alterConfigs broker 1 validateOnly', async () => {
    const r = await admin.alterConfigs({ validateOnly: true, resources: [{ type: 4, name: '1', configEntries: [{ name: 'log.retention.ms', value: '1000000' }] }] })
    return r.resources.map(x => ({ errorCode: x.errorCode, errorMessage: x.errorMessage }))
  })
  await step('alterConfigs', async () => {
    const r = await admin.alterConfigs({
      validateOnly: false,
      resources: [{ type: 2, name: topic, configEntries: [{ name: 'retention.ms', value: '3600000' }, { name: 'min.insync.replicas', value: '2' }] }],
    })
    return r.resources.map(x => ({ errorCode: x.errorCode, errorMessage: x.errorMessage }))
  })
  await step('describeConfigs after alterConfigs', async () => {
    // An alteration reaches every broker through ZooKeeper: ask until the broker answering shows it.
    const r = await until(() => admin.describeConfigs(topicResource(watched)),
      d => d.resources[0].configEntries.some(c => c.configName === 'min.insync.replicas' && c.configValue === '2'))
    return configEntries(r)
  })
  await step('alterConfigs validateOnly unknown key', async () => {
    const r = await admin.alterConfigs({
      validateOnly: true,
      resources: [{ type: 2, name: topic, configEntries: [{ name: 'no.such.config', value: '1' }] }],
    })
    return r.resources.map(x => ({ errorCode: x.errorCode }))
  })

  // Record timestamps a minute back (within the altered retention.ms), one second apart: the
  // offsets found by timestamp are then the same on both clusters.
  const timestampBase = Date.now() - 60000
  const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1, allowAutoTopicCreation: false })
  await step('producer connect', () => producer.connect())
  await step('producer send acks -1', async () => {
    const sent = []
    for (let i = 0; i < 5; i++) { // one batch each: five base offsets
      const timestamp = String(timestampBase + i * 1000)
      const r = await producer.send({ topic, acks: -1, messages: [{ partition: 0, key: `k${i}`, value: `v${i}`, timestamp }] })
      sent.push(...r.map(x => ({ partition: x.partition, errorCode: x.errorCode, baseOffset: x.baseOffset })))
    }
    const r = await producer.send({ topic, acks: -1, messages: [{ partition: 1, key: 'k5', value: 'v5' }, { partition: 2, key: 'k6', value: 'v6' }] })
    sent.push(...r.map(x => ({ partition: x.partition, errorCode: x.errorCode, baseOffset: x.baseOffset }))
      .sort((a, b) => a.partition - b.partition))
    return sent
  })
  await step('producer disconnect', () => producer.disconnect())

  const offsets = async () => (await admin.fetchTopicOffsets(topic))
    .map(o => ({ partition: o.partition, low: o.low, high: o.high }))
    .sort((a, b) => a.partition - b.partition)
  await step('fetchTopicOffsets', offsets)
  await step('fetchTopicOffsetsByTimestamp', async () => (await admin.fetchTopicOffsetsByTimestamp(topic, timestampBase + 2500))
    .map(o => ({ partition: o.partition, offset: o.offset }))
    .sort((a, b) => a.partition - b.partition))
  await step('deleteRecords partition 0 before offset 2', () =>
    admin.deleteTopicRecords({ topic, partitions: [{ partition: 0, offset: '2' }] }))
  await step('deleteRecords beyond the high watermark', () =>
    admin.deleteTopicRecords({ topic, partitions: [{ partition: 1, offset: '10' }] }))
  await step('deleteRecords partition 2 to the high watermark (-1)', () =>
    admin.deleteTopicRecords({ topic, partitions: [{ partition: 2, offset: '-1' }] }))
  await step('fetchTopicOffsets after deleteRecords', offsets)

  // KafkaJS's consumer reads with isolation level read_committed unless told otherwise.
  // The group consumes from the beginning (partition 0 now starts at 2) every record there is,
  // committing each by hand.
  let expected = 0
  try {
    expected = (await admin.fetchTopicOffsets(topic)).reduce((n, o) => n + Number(o.high) - Number(o.low), 0)
  } catch (e) {}
  const consumer = kafka.consumer({
    groupId: group, sessionTimeout: 10000, rebalanceTimeout: 20000, heartbeatInterval: 1000,
    retry: { retries: 3, initialRetryTime: 200, maxRetryTime: 2000 }, maxWaitTimeInMs: 500,
  })
  await step('consumer connect', () => consumer.connect())
  await step('consumer subscribe', () => consumer.subscribe({ topics: [topic], fromBeginning: true }))
  await step('consumer consume and commit', async () => {
    const received = []
    await new Promise((resolve, reject) => {
      consumer.run({
        autoCommit: false,
        eachMessage: async ({ partition, message }) => {
          received.push({ partition, offset: message.offset, key: message.key.toString(), value: message.value.toString() })
          await consumer.commitOffsets([{ topic, partition, offset: String(Number(message.offset) + 1) }])
          if (received.length >= expected) resolve()
        },
      }).catch(reject)
      consumer.on(consumer.events.CRASH, e => reject(e.payload.error))
    })
    return received.sort((a, b) => a.partition - b.partition || Number(a.offset) - Number(b.offset))
  })
  await step('describeGroups while consuming', async () => {
    const { groups } = await admin.describeGroups([group])
    return groups.map(g => ({ errorCode: g.errorCode, state: g.state, protocolType: g.protocolType, protocol: g.protocol, members: g.members.map(m => ({ clientId: m.clientId, assigned: m.memberAssignment.length > 0 })) }))
  })
  await step('deleteGroups while consuming', () => admin.deleteGroups([group]))
  await step('setOffsets while consuming', () => admin.setOffsets({ groupId: group, topic, partitions: [{ partition: 0, offset: '0' }] }))
  await step('consumer disconnect', () => consumer.disconnect())

  await step('describeGroups', async () => {
    const { groups } = await admin.describeGroups([group])
    return groups.map(g => ({ errorCode: g.errorCode, state: g.state, protocolType: g.protocolType, protocol: g.protocol, members: g.members.length }))
  })
  await step('fetchOffsets', async () => {
    const r = await admin.fetchOffsets({ groupId: group, topics: [topic] })
    return r.map(t => ({ partitions: [...t.partitions].sort((a, b) => a.partition - b.partition).map(p => ({ partition: p.partition, offset: p.offset })) }))
  })
  await step('fetchOffsets resolveOffsets', async () => {
    const r = await admin.fetchOffsets({ groupId: group, topics: [topic], resolveOffsets: true })
    return r.map(t => [...t.partitions].sort((a, b) => a.partition - b.partition).map(p => ({ partition: p.partition, offset: p.offset })))
  })
  await step('setOffsets', () => admin.setOffsets({ groupId: group, topic, partitions: [{ partition: 0, offset: '3' }, { partition: 1, offset: '0' }, { partition: 2, offset: '1' }] }))
  await step('resetOffsets earliest', () => admin.resetOffsets({ groupId: group, topic, earliest: true }))
  await step('fetchOffsets after resetOffsets', async () => {
    const r = await admin.fetchOffsets({ groupId: group, topics: [topic] })
    return r.map(t => [...t.partitions].sort((a, b) => a.partition - b.partition).map(p => ({ partition: p.partition, offset: p.offset })))
  })
  await step('listGroups', async () => {
    const { groups } = await admin.listGroups()
    return groups.filter(g => g.groupId === group).map(g => ({ protocolType: g.protocolType }))
  })
  await step('deleteGroups', async () => {
    const r = await admin.deleteGroups([group])
    return r.map(g => ({ errorCode: g.errorCode }))
  })
  await step('deleteGroups unknown group', () => admin.deleteGroups([`${group}-unknown`]))
  await step('deleteGroups again', async () => {
    const r = await admin.deleteGroups([group])
    return r.map(g => ({ errorCode: g.errorCode }))
  })
  await step('describeGroups after deleteGroups', async () => {
    const { groups } = await admin.describeGroups([group])
    return groups.map(g => ({ errorCode: g.errorCode, state: g.state, members: g.members.length }))
  })
  await step('listGroups after deleteGroups', async () => {
    const { groups } = await admin.listGroups()
    return groups.filter(g => g.groupId === group).length
  })

  await transactions(admin)

  await step('deleteTopics', () => admin.deleteTopics({ topics: [topic, `${topic}-assigned`, `${topic}-tx`], timeout: 30000 }))
  await step('listTopics after deleteTopics', async () => {
    const names = await until(() => admin.listTopics(), n => !n.includes(topic))
    return names.includes(topic)
  })
  await step('deleteTopics unknown topic', () => admin.deleteTopics({ topics: [topic], timeout: 30000 }))

  await step('admin disconnect', () => admin.disconnect())
}

// A transactional producer: a commit, an abort, offsets sent in a transaction (TxnOffsetCommit),
// what a read_committed consumer then reads, and a second producer with the same transactional
// id fencing the first.
async function transactions (admin) {
  const txTopic = `${topic}-tx`
  const txGroup = `${group}-tx`
  await step('createTopics for transactions', () =>
    admin.createTopics({ topics: [{ topic: txTopic, numPartitions: 2, replicationFactor: 3 }], waitForLeaders: true, timeout: 30000 }))
  const producer = kafka.producer({ transactionalId: `kafkajs-tx-${suffix}`, idempotent: true, maxInFlightRequests: 1 })
  const sent = r => r.map(x => ({ partition: x.partition, errorCode: x.errorCode, baseOffset: x.baseOffset })).sort((a, b) => a.partition - b.partition)
  await step('transactional producer connect', () => producer.connect())
  await step('transaction send and commit', async () => {
    const tx = await producer.transaction()
    const r = await tx.send({ topic: txTopic, acks: -1, messages: [{ partition: 0, value: 'committed-1' }, { partition: 1, value: 'committed-2' }] })
    await tx.commit()
    return sent(r)
  })
  await step('transaction send and abort', async () => {
    const tx = await producer.transaction()
    const r = await tx.send({ topic: txTopic, acks: -1, messages: [{ partition: 0, value: 'aborted' }] })
    await tx.abort()
    return sent(r)
  })
  await step('transaction sendOffsets and commit', async () => {
    const tx = await producer.transaction()
    const r = await tx.send({ topic: txTopic, acks: -1, messages: [{ partition: 1, value: 'committed-3' }] })
    await tx.sendOffsets({ consumerGroupId: txGroup, topics: [{ topic: txTopic, partitions: [{ partition: 0, offset: '1' }] }] })
    await tx.commit()
    return sent(r)
  })
  // The markers go out after EndTxn is answered, on Kafka too: wait for what they complete.
  await step('fetchOffsets of the transaction', async () => {
    const r = await until(() => admin.fetchOffsets({ groupId: txGroup, topics: [txTopic] }),
      r => r[0].partitions.some(p => p.offset === '1'))
    return r.map(t => [...t.partitions].sort((a, b) => a.partition - b.partition).map(p => ({ partition: p.partition, offset: p.offset })))
  })
  await step('fetchTopicOffsets after the transactions', async () => {
    const r = await until(() => admin.fetchTopicOffsets(txTopic), r => r.every(o => o.high === '4'))
    return r.sort((a, b) => a.partition - b.partition).map(o => ({ partition: o.partition, high: o.high, low: o.low }))
  })
  const reader = kafka.consumer({ groupId: `${txGroup}-reader`, maxWaitTimeInMs: 500, retry: { retries: 3, initialRetryTime: 200, maxRetryTime: 2000 } })
  await step('read_committed consumer reads the committed records', async () => {
    await reader.connect()
    await reader.subscribe({ topics: [txTopic], fromBeginning: true })
    const received = []
    await new Promise((resolve, reject) => {
      reader.run({
        eachMessage: async ({ partition, message }) => {
          received.push({ partition, offset: message.offset, value: message.value.toString() })
          if (received.length >= 3) resolve()
        },
      }).catch(reject)
      reader.on(reader.events.CRASH, e => reject(e.payload.error))
    })
    await reader.disconnect()
    return received.sort((a, b) => a.partition - b.partition || Number(a.offset) - Number(b.offset))
  })
  const newer = kafka.producer({ transactionalId: `kafkajs-tx-${suffix}`, idempotent: true, maxInFlightRequests: 1 })
  let newerTx
  await step('a second producer with the same transactional id', async () => {
    await newer.connect()
    newerTx = await newer.transaction() // InitProducerId: bumps the epoch
  })
  await step('the first producer is fenced', async () => {
    const tx = await producer.transaction()
    try {
      await tx.send({ topic: txTopic, acks: -1, messages: [{ partition: 0, value: 'zombie' }] })
      await tx.commit()
      return 'not fenced'
    } catch (e) {
      return { name: e.name, type: e.type, retriable: e.retriable }
    }
  })
  await step('transactional producers disconnect', async () => {
    if (newerTx) await newerTx.abort()
    await producer.disconnect()
    await newer.disconnect()
  })
}

;main().then(() => process.exit(0), e => {
  console.error(e)
  process.exit(1)
})
